-- The protocol of a fencecheck worker (contract v2, sections 5 and 6) as SQL
-- functions. Applied by `migrate` after schema.sql, as a superuser.
--
-- Why functions: the worker and operator groups may write no table directly
-- (section 7.5). Each function runs with the rights of fencecheck_owner, a
-- NOLOGIN role that owns the tables; their row level security is FORCEd, so
-- every statement below still sees and writes only the tenant of the
-- session's login role (fencecheck.session_tenant() reads session_user).
--
-- Errors a caller must tell apart carry their own SQLSTATE (worker.py maps
-- them to the contract's error classes): FC001 LeaseLost, FC002
-- RevisionConflict, FC003 RunNotFound, FC004 TaskExists, FC005
-- RunNotRetryable, FC006 LedgerConflict.

-- A column of this worker's own (the contract allows more columns): the
-- request body a dispatcher sends, kept with its intent.
ALTER TABLE public.tool_operations ADD COLUMN IF NOT EXISTS request jsonb;

-- ------------------------------------------------------------ leases
-- Grant the lease of one claimable run: epoch + 1, owner, expiry by database
-- time. Without p_run: any claimable run of the tenant, expired leases first,
-- skipping rows another session holds. With p_run: that run only, waiting on
-- its row lock (a protected write in progress finishes first).
CREATE OR REPLACE FUNCTION fencecheck.claim(p_owner text, p_ttl_ms bigint, p_run uuid)
RETURNS SETOF public.agent_runs
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_run uuid;
BEGIN
  IF p_run IS NULL THEN
    SELECT r.run_id INTO v_run FROM public.agent_runs r
     WHERE (r.status = 'queued' AND r.next_attempt_at <= clock_timestamp())
        OR (r.status IN ('running', 'waiting_tool') AND r.lease_expires_at <= clock_timestamp())
     ORDER BY (r.status = 'queued'), r.next_attempt_at
     LIMIT 1 FOR UPDATE SKIP LOCKED;
  ELSE
    SELECT r.run_id INTO v_run FROM public.agent_runs r
     WHERE r.run_id = p_run FOR UPDATE;
  END IF;
  RETURN QUERY
    UPDATE public.agent_runs r
       SET epoch = r.epoch + 1, owner = p_owner,
           lease_expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond',
           attempt_count = r.attempt_count + (r.status = 'queued')::int,
           status = CASE WHEN r.status = 'queued' THEN 'running' ELSE r.status END,
           updated_at = clock_timestamp()
     WHERE r.run_id = v_run
       AND ((r.status = 'queued' AND r.next_attempt_at <= clock_timestamp())
         OR (r.status IN ('running', 'waiting_tool') AND r.lease_expires_at <= clock_timestamp()))
    RETURNING r.*;
END
$$;

-- Move the expiry, only for the current owner and epoch of an unexpired lease.
CREATE OR REPLACE FUNCTION fencecheck.renew(p_run uuid, p_owner text, p_epoch bigint, p_ttl_ms bigint)
RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_expires timestamptz;
BEGIN
  UPDATE public.agent_runs
     SET lease_expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond',
         updated_at = clock_timestamp()
   WHERE run_id = p_run AND owner = p_owner AND epoch = p_epoch
     AND lease_expires_at > clock_timestamp()
  RETURNING lease_expires_at INTO v_expires;
  IF v_expires IS NULL THEN
    RAISE EXCEPTION 'not the current unexpired lease' USING ERRCODE = 'FC001';
  END IF;
  RETURN v_expires;
END
$$;

-- Give the lease up: queued again, epoch kept. In the run's last attempt
-- the attempt is given back: a release interrupts an attempt, it does not end
-- one (else the next claim takes the run past its budget).
CREATE OR REPLACE FUNCTION fencecheck.release(p_run uuid, p_owner text, p_epoch bigint)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.agent_runs
     SET status = 'queued', owner = NULL, lease_expires_at = NULL, updated_at = clock_timestamp(),
         max_attempts = GREATEST(max_attempts, attempt_count + 1)
   WHERE run_id = p_run AND owner = p_owner AND epoch = p_epoch
     AND lease_expires_at > clock_timestamp();
  IF NOT FOUND THEN
    RAISE EXCEPTION 'not the current unexpired lease' USING ERRCODE = 'FC001';
  END IF;
END
$$;

-- Lock the run's row and check the lease; the lock is held until the
-- caller's transaction ends (the first step of a protected write).
CREATE OR REPLACE FUNCTION fencecheck.lock_lease(p_run uuid, p_owner text, p_epoch bigint)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r public.agent_runs;
BEGIN
  SELECT * INTO r FROM public.agent_runs WHERE run_id = p_run FOR UPDATE;
  IF r.run_id IS NULL THEN
    RAISE EXCEPTION 'no run %', p_run USING ERRCODE = 'FC003';
  END IF;
  IF r.owner IS DISTINCT FROM p_owner OR r.epoch <> p_epoch
     OR NOT coalesce(r.lease_expires_at > clock_timestamp(), false) THEN
    RAISE EXCEPTION 'not the current unexpired lease (owner %, epoch %)', r.owner, r.epoch
      USING ERRCODE = 'FC001';
  END IF;
  RETURN r.revision;
END
$$;

-- ------------------------------------------------------------ protected write
-- One protected write (section 6): under the current unexpired lease and at
-- the expected revision, revision + 1, one checkpoint and one outbox event
-- with the same event id, and the run's new status (null: unchanged); a
-- status that holds no lease gives the lease up. Optionally, in the same transaction:
--   p_intent {operation_id, step_id, effect_version, tool, digest, request,
--     retention_ms}: registers the ledger row `prepared` (a tool intent);
--   p_result {operation_id, status, remote_id}: the operation's final status,
--     from `dispatching` (this owner's claim) or `unknown`, or adopted as it is;
--   p_delay_ms: for status `queued`, the run is not claimable before then.
CREATE OR REPLACE FUNCTION fencecheck.protected_write(
  p_run uuid, p_owner text, p_epoch bigint, p_expected bigint,
  p_state jsonb, p_state_hash bytea, p_schema_version integer, p_event_id uuid,
  p_step text, p_status text, p_event_type text, p_payload jsonb,
  p_intent jsonb, p_result jsonb, p_delay_ms bigint)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_revision bigint;
  v_op public.tool_operations;
BEGIN
  v_revision := fencecheck.lock_lease(p_run, p_owner, p_epoch);
  IF v_revision <> p_expected THEN
    RAISE EXCEPTION 'revision is %, expected %', v_revision, p_expected USING ERRCODE = 'FC002';
  END IF;
  UPDATE public.agent_runs
     SET revision = revision + 1, status = coalesce(p_status, status),
         current_step = coalesce(p_step, current_step),
         checkpoint_schema_version = p_schema_version,
         owner = CASE WHEN coalesce(p_status, status) IN ('running', 'waiting_tool') THEN owner END,
         lease_expires_at = CASE WHEN coalesce(p_status, status) IN ('running', 'waiting_tool')
                                 THEN lease_expires_at END,
         next_attempt_at = CASE WHEN p_delay_ms IS NULL THEN next_attempt_at
                                ELSE clock_timestamp() + p_delay_ms * interval '1 millisecond' END,
         updated_at = clock_timestamp()
   WHERE run_id = p_run
  RETURNING revision INTO v_revision;
  INSERT INTO public.agent_checkpoints
         (run_id, revision, tenant_id, epoch, owner, state_json, state_hash, schema_version, event_id)
  VALUES (p_run, v_revision, fencecheck.session_tenant(), p_epoch, p_owner, p_state, p_state_hash,
          p_schema_version, p_event_id);
  INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
  VALUES (p_event_id, fencecheck.session_tenant(), p_run, p_event_type, p_payload);
  IF p_intent IS NOT NULL THEN
    INSERT INTO public.tool_operations
           (operation_id, tenant_id, run_id, step_id, effect_version, tool_name,
            idempotency_key, request_digest, status, request, retention_ms)
    VALUES (p_intent->>'operation_id', fencecheck.session_tenant(), p_run, p_intent->>'step_id',
            (p_intent->>'effect_version')::int, p_intent->>'tool', p_intent->>'operation_id',
            p_intent->>'digest', 'prepared', p_intent->'request', (p_intent->>'retention_ms')::bigint);
  END IF;
  IF p_result IS NOT NULL THEN
    SELECT * INTO v_op FROM public.tool_operations
     WHERE operation_id = p_result->>'operation_id' AND run_id = p_run FOR UPDATE;
    IF v_op.status = p_result->>'status' THEN
      NULL;  -- already converged (by the dispatcher, the reconciler or a callback): adopt it
    ELSIF (v_op.status = 'dispatching' AND v_op.dispatch_owner = p_owner) OR v_op.status = 'unknown' THEN
      UPDATE public.tool_operations
         SET status = p_result->>'status', remote_id = p_result->>'remote_id',
             revision = revision + 1, updated_at = clock_timestamp()
       WHERE operation_id = v_op.operation_id;
    ELSE
      RAISE EXCEPTION 'operation % is %', p_result->>'operation_id', coalesce(v_op.status, 'missing')
        USING ERRCODE = 'FC006';
    END IF;
  END IF;
  RETURN v_revision;
END
$$;

-- ------------------------------------------------------------ ledger
-- Claim one prepared operation of a live run for dispatch (with a deadline).
CREATE OR REPLACE FUNCTION fencecheck.dispatch_claim(p_operation text, p_owner text, p_ttl_ms bigint)
RETURNS SETOF public.tool_operations
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
    UPDATE public.tool_operations o
       SET status = 'dispatching', dispatch_owner = p_owner,
           dispatch_until = clock_timestamp() + p_ttl_ms * interval '1 millisecond',
           first_dispatched_at = coalesce(o.first_dispatched_at, clock_timestamp()),
           revision = o.revision + 1, updated_at = clock_timestamp()
     WHERE o.operation_id = (
             SELECT c.operation_id FROM public.tool_operations c
               JOIN public.agent_runs r ON r.run_id = c.run_id
              WHERE c.status = 'prepared' AND (p_operation IS NULL OR c.operation_id = p_operation)
                AND r.status IN ('running', 'waiting_tool', 'queued')
              ORDER BY c.updated_at LIMIT 1 FOR UPDATE OF c SKIP LOCKED)
    RETURNING o.*;
END
$$;

-- Claim an unknown operation of a live run for a same-key resend (the caller
-- sends only to idempotent and deterministic_id tools), while the tool still
-- remembers the key: within retention_ms of the first dispatch.
CREATE OR REPLACE FUNCTION fencecheck.ledger_claim_retry(p_operation text, p_owner text, p_ttl_ms bigint)
RETURNS SETOF public.tool_operations
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
    UPDATE public.tool_operations o
       SET status = 'dispatching', dispatch_owner = p_owner,
           dispatch_until = clock_timestamp() + p_ttl_ms * interval '1 millisecond',
           revision = o.revision + 1, updated_at = clock_timestamp()
     WHERE o.operation_id = p_operation AND o.status = 'unknown'
       AND EXISTS (SELECT 1 FROM public.agent_runs r WHERE r.run_id = o.run_id
                     AND r.status NOT IN ('succeeded', 'failed', 'cancelled'))
       AND (o.retention_ms IS NULL OR o.first_dispatched_at IS NULL
            OR o.first_dispatched_at + o.retention_ms * interval '1 millisecond' > clock_timestamp())
    RETURNING o.*;
END
$$;

-- The tool's answer, recorded only by the claim that sent it (same dispatch
-- owner, same ledger revision): succeeded / failed_final (definite), unknown
-- (no definite answer), prepared (the tool proved it did nothing: 429).
CREATE OR REPLACE FUNCTION fencecheck.record_tool_result(
  p_operation text, p_owner text, p_revision bigint, p_status text, p_remote_id text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.tool_operations
     SET status = p_status, remote_id = p_remote_id, revision = revision + 1,
         updated_at = clock_timestamp()
   WHERE operation_id = p_operation AND status = 'dispatching'
     AND dispatch_owner = p_owner AND revision = p_revision;
  RETURN FOUND;
END
$$;

-- Dispatch claims past their deadline become unknown (never prepared: the
-- tool may have acted). A row another session holds is passed by (SKIP
-- LOCKED) and expired by a later cycle: one held row never stalls the sweep.
CREATE OR REPLACE FUNCTION fencecheck.reconcile_expire_claims()
RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  UPDATE public.tool_operations
     SET status = 'unknown', revision = revision + 1, updated_at = clock_timestamp()
   WHERE operation_id IN (
     SELECT operation_id FROM public.tool_operations
      WHERE status = 'dispatching' AND dispatch_until < clock_timestamp()
        FOR UPDATE SKIP LOCKED)
  RETURNING operation_id
$$;

-- An unknown operation converges to a fact learnt from the tool (a query).
CREATE OR REPLACE FUNCTION fencecheck.ledger_converge(p_operation text, p_status text, p_remote_id text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.tool_operations
     SET status = p_status, remote_id = p_remote_id, revision = revision + 1,
         updated_at = clock_timestamp()
   WHERE operation_id = p_operation AND status = 'unknown';
  RETURN FOUND;
END
$$;

-- ------------------------------------------------------------ outbox
CREATE OR REPLACE FUNCTION fencecheck.outbox_lock_batch(p_limit integer)
RETURNS SETOF public.outbox
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM public.outbox WHERE published_at IS NULL
   ORDER BY id LIMIT p_limit FOR UPDATE SKIP LOCKED
$$;

CREATE OR REPLACE FUNCTION fencecheck.outbox_mark_published(p_event_id uuid)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  UPDATE public.outbox SET published_at = clock_timestamp()
   WHERE event_id = p_event_id AND published_at IS NULL
$$;

-- ------------------------------------------------------------ control plane
CREATE OR REPLACE FUNCTION fencecheck.create_run(p_task text, p_input jsonb, p_max_attempts integer)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_run uuid := gen_random_uuid();
BEGIN
  INSERT INTO public.agent_tasks (tenant_id, task_id) VALUES (fencecheck.session_tenant(), p_task)
  ON CONFLICT DO NOTHING;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'task % exists', p_task USING ERRCODE = 'FC004';
  END IF;
  INSERT INTO public.agent_runs (run_id, tenant_id, task_id, input, max_attempts)
  VALUES (v_run, fencecheck.session_tenant(), p_task, p_input, p_max_attempts);
  UPDATE public.agent_tasks SET active_run_id = v_run
   WHERE tenant_id = fencecheck.session_tenant() AND task_id = p_task;
  RETURN v_run;
END
$$;

-- A new run of a task whose active run is paused or terminal.
CREATE OR REPLACE FUNCTION fencecheck.retry_run(p_task text)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_old public.agent_runs;
  v_run uuid := gen_random_uuid();
BEGIN
  SELECT r.* INTO v_old FROM public.agent_tasks t JOIN public.agent_runs r ON r.run_id = t.active_run_id
   WHERE t.task_id = p_task FOR UPDATE OF t;
  IF v_old.run_id IS NULL THEN
    RAISE EXCEPTION 'no task %', p_task USING ERRCODE = 'FC003';
  END IF;
  IF v_old.status NOT IN ('paused_indoubt', 'paused_human', 'succeeded', 'failed', 'cancelled') THEN
    RAISE EXCEPTION 'run % is %', v_old.run_id, v_old.status USING ERRCODE = 'FC005';
  END IF;
  INSERT INTO public.agent_runs (run_id, tenant_id, task_id, input, max_attempts)
  VALUES (v_run, v_old.tenant_id, p_task, v_old.input, v_old.max_attempts);
  UPDATE public.agent_tasks SET active_run_id = v_run
   WHERE tenant_id = v_old.tenant_id AND task_id = p_task;
  RETURN v_run;
END
$$;

-- Cancel a run: it gives its lease up; prepared operations are cancelled,
-- in-flight ones (dispatching, unknown) stay as they are (they may have
-- happened). Audited in operator_actions.
CREATE OR REPLACE FUNCTION fencecheck.cancel_run(p_run uuid, p_reason text, p_ticket text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_before public.agent_runs;
  v_after public.agent_runs;
  v_audit bigint;
BEGIN
  SELECT * INTO v_before FROM public.agent_runs WHERE run_id = p_run FOR UPDATE;
  IF v_before.run_id IS NULL THEN
    RAISE EXCEPTION 'no run %', p_run USING ERRCODE = 'FC003';
  END IF;
  UPDATE public.agent_runs
     SET status = 'cancelled', owner = NULL, lease_expires_at = NULL, updated_at = clock_timestamp()
   WHERE run_id = p_run AND status NOT IN ('succeeded', 'failed', 'cancelled');
  UPDATE public.tool_operations
     SET status = 'cancelled', revision = revision + 1, updated_at = clock_timestamp()
   WHERE run_id = p_run AND status = 'prepared';
  SELECT * INTO v_after FROM public.agent_runs WHERE run_id = p_run;
  INSERT INTO public.operator_actions (tenant_id, run_id, action, reason, ticket, before, after)
  VALUES (v_before.tenant_id, p_run, 'cancel', coalesce(nullif(p_reason, ''), 'cancelled'), p_ticket,
          to_jsonb(v_before), to_jsonb(v_after))
  RETURNING id INTO v_audit;
  RETURN jsonb_build_object(
    'run_status', v_after.status,
    'audit_id', v_audit,
    'operations', coalesce((SELECT jsonb_agg(jsonb_build_object('operation_id', operation_id, 'status', status))
                              FROM public.tool_operations WHERE run_id = p_run), '[]'::jsonb));
END
$$;

-- A tool's callback: accepted only for an in-flight operation of the run
-- that is its task's active, live run.
CREATE OR REPLACE FUNCTION fencecheck.deliver_callback(p_run uuid, p_operation text, p_payload jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.tool_operations o
     SET status = 'succeeded',
         remote_id = coalesce(p_payload->>'resource_id', p_payload->>'remote_id'),
         revision = o.revision + 1, updated_at = clock_timestamp()
    FROM public.agent_runs r JOIN public.agent_tasks t
      ON t.tenant_id = r.tenant_id AND t.task_id = r.task_id AND t.active_run_id = r.run_id
   WHERE o.operation_id = p_operation AND o.run_id = p_run AND r.run_id = p_run
     AND o.status IN ('dispatching', 'unknown')
     AND r.status NOT IN ('succeeded', 'failed', 'cancelled');
  RETURN FOUND;
END
$$;

-- Cancel and in-flight effects: an operation of a cancelled run, or of a run
-- a retry superseded (its task's next run does the step again), that becomes
-- succeeded (a reconciler's convergence, say) asks the owning service to
-- compensate, in the same transaction: one outbox event
-- agent.compensation_required naming it. A trigger, so every path writes it.
CREATE OR REPLACE FUNCTION fencecheck.ledger_compensation() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NEW.status = 'succeeded' AND OLD.status <> 'succeeded' AND EXISTS (
       SELECT 1 FROM public.agent_runs r
        WHERE r.run_id = NEW.run_id
          AND (r.status = 'cancelled'
               OR EXISTS (SELECT 1 FROM public.agent_tasks t
                           WHERE t.tenant_id = r.tenant_id AND t.task_id = r.task_id
                             AND t.active_run_id <> r.run_id))) THEN
    INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
    VALUES (gen_random_uuid(), NEW.tenant_id, NEW.run_id, 'agent.compensation_required',
            jsonb_build_object('run_id', NEW.run_id, 'operation_id', NEW.operation_id,
                               'remote_id', NEW.remote_id));
  END IF;
  RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS tool_operations_compensation ON public.tool_operations;
CREATE TRIGGER tool_operations_compensation AFTER UPDATE OF status ON public.tool_operations
  FOR EACH ROW EXECUTE FUNCTION fencecheck.ledger_compensation();

-- ------------------------------------------------------------ privileges
DO $$
DECLARE
  f text;
  worker_api text[] := ARRAY['claim', 'renew', 'release', 'lock_lease', 'protected_write',
    'dispatch_claim', 'record_tool_result', 'reconcile_expire_claims', 'ledger_converge',
    'ledger_claim_retry', 'outbox_lock_batch', 'outbox_mark_published'];
  control_api text[] := ARRAY['create_run', 'retry_run', 'cancel_run', 'deliver_callback',
    'record_tool_result', 'reconcile_expire_claims', 'ledger_converge', 'ledger_claim_retry'];
BEGIN
  FOR f IN SELECT p.oid::regprocedure::text FROM pg_proc p
            WHERE p.pronamespace = 'fencecheck'::regnamespace AND p.proname <> 'session_tenant' LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO fencecheck_owner', f);
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
  END LOOP;
  FOR f IN SELECT p.oid::regprocedure::text FROM pg_proc p
            WHERE p.pronamespace = 'fencecheck'::regnamespace AND p.proname = ANY (worker_api) LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO fencecheck_worker', f);
  END LOOP;
  FOR f IN SELECT p.oid::regprocedure::text FROM pg_proc p
            WHERE p.pronamespace = 'fencecheck'::regnamespace AND p.proname = ANY (control_api) LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO fencecheck_operator', f);
  END LOOP;
END
$$;

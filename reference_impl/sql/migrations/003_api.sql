-- The protocol's write API. Every function here is SECURITY DEFINER, owned
-- by fencecheck_owner, with a pinned search_path; tables are FORCE'd under
-- RLS, so each function sees the caller's tenant (app.tenant_id) only.
-- Functions whose name starts with "_" are internal: not executable by the
-- worker role, so no check can be skipped by calling a helper directly.
--
-- Rejections are raised with custom SQLSTATEs (class FC) that the client
-- classifies by code, never by message:
--   FC001 lease lost (owner/epoch do not match)   FC002 lease expired
--   FC003 run not found (or other tenant)          FC004 state forbids it
--   FC005 revision conflict                        FC006 intent conflict
--   FC007 ledger conflict                          FC008 run not retryable
--   FC010 task exists                              FC011 tenant unset
-- Lease functions report zero-row causes as an outcome column instead.

CREATE TYPE fencecheck.lease_grant AS (
  outcome          text,         -- acquired | missing | held | terminal | paused | not_due
  run_id           uuid,
  owner            text,
  epoch            bigint,
  revision         bigint,
  status           text,
  lease_expires_at timestamptz,
  previous_owner   text,
  expired_for_ms   double precision,  -- how long the lease had been expired (takeover)
  lock_wait_ms     double precision
);

CREATE TYPE fencecheck.ledger_outcome AS (
  outcome  text,   -- ok | missing | not_dispatching | owner_mismatch | revision_mismatch | digest_mismatch | ...
  status   text,
  revision bigint
);

-- ------------------------------------------------------------ helpers

CREATE FUNCTION fencecheck._tenant() RETURNS uuid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v uuid := NULLIF(current_setting('app.tenant_id', true), '')::uuid;
BEGIN
  IF v IS NULL THEN
    RAISE EXCEPTION 'app.tenant_id is not set' USING ERRCODE = 'FC011';
  END IF;
  RETURN v;
END
$$;

CREATE FUNCTION fencecheck._ms(p_ms bigint) RETURNS interval
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  -- TTLs travel as integer milliseconds, never as interval text.
  IF p_ms IS NULL OR p_ms <= 0 OR p_ms > 86400000 THEN
    RAISE EXCEPTION 'duration must be 1..86400000 ms, got %', p_ms USING ERRCODE = '22023';
  END IF;
  RETURN p_ms * interval '1 millisecond';
END
$$;

-- ------------------------------------------------------------ runs

CREATE FUNCTION fencecheck.create_run(p_task_id text, p_input jsonb, p_max_attempts integer DEFAULT 12)
RETURNS TABLE (run_id uuid, task_id text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_tenant uuid := fencecheck._tenant();
  v_run uuid := gen_random_uuid();
BEGIN
  INSERT INTO public.tenants (tenant_id) VALUES (v_tenant) ON CONFLICT DO NOTHING;
  INSERT INTO public.agent_tasks (tenant_id, task_id, active_run_id)
  VALUES (v_tenant, p_task_id, v_run) ON CONFLICT DO NOTHING;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'task % exists; use retry_run', p_task_id USING ERRCODE = 'FC010';
  END IF;
  INSERT INTO public.agent_runs (run_id, tenant_id, task_id, input, max_attempts)
  VALUES (v_run, v_tenant, p_task_id, COALESCE(p_input, '{}'::jsonb), p_max_attempts);
  RETURN QUERY SELECT v_run, p_task_id;
END
$$;

-- A retry is a new run_id under the same task; active_run_id switches in the
-- same transaction; the old run stays exactly as it is.
CREATE FUNCTION fencecheck.retry_run(p_task_id text)
RETURNS TABLE (run_id uuid, task_id text, retry_of uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_task public.agent_tasks%ROWTYPE;
  v_old public.agent_runs%ROWTYPE;
  v_run uuid := gen_random_uuid();
BEGIN
  SELECT * INTO v_task FROM public.agent_tasks t WHERE t.task_id = p_task_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'task % not found', p_task_id USING ERRCODE = 'FC003';
  END IF;
  SELECT * INTO v_old FROM public.agent_runs r WHERE r.run_id = v_task.active_run_id;
  IF v_old.status IN ('queued', 'running', 'waiting_tool') THEN
    RAISE EXCEPTION 'run % of task % is still %; cancel it first', v_old.run_id, p_task_id, v_old.status
      USING ERRCODE = 'FC008';
  END IF;
  INSERT INTO public.agent_runs (run_id, tenant_id, task_id, input, max_attempts, retry_of)
  VALUES (v_run, v_task.tenant_id, p_task_id, v_old.input, v_old.max_attempts, v_old.run_id);
  UPDATE public.agent_tasks t SET active_run_id = v_run, updated_at = clock_timestamp()
   WHERE t.tenant_id = v_task.tenant_id AND t.task_id = p_task_id;
  RETURN QUERY SELECT v_run, p_task_id, v_old.run_id;
END
$$;

-- ------------------------------------------------------------ leases (rule 1)

-- The one statement that grants a lease: epoch + 1, database time, TTL in ms.
-- Callers hold the row lock and have decided the lease is free or expired.
CREATE FUNCTION fencecheck._grant(p_run_id uuid, p_owner text, p_ttl_ms bigint,
                                  p_prev_owner text, p_prev_expiry timestamptz,
                                  p_lock_wait_ms double precision)
RETURNS fencecheck.lease_grant
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  g fencecheck.lease_grant;
BEGIN
  UPDATE public.agent_runs r
     SET owner = p_owner,
         epoch = r.epoch + 1,
         lease_expires_at = clock_timestamp() + fencecheck._ms(p_ttl_ms),
         status = CASE WHEN r.status = 'queued' THEN 'running' ELSE r.status END,
         attempt_count = r.attempt_count + CASE WHEN r.status = 'queued' THEN 1 ELSE 0 END,
         updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id
  RETURNING 'acquired', r.run_id, r.owner, r.epoch, r.revision, r.status, r.lease_expires_at,
            p_prev_owner,
            CASE WHEN p_prev_expiry IS NULL THEN NULL
                 ELSE (extract(epoch FROM clock_timestamp() - p_prev_expiry) * 1000)::float8 END,
            p_lock_wait_ms
    INTO g;
  RETURN g;
END
$$;

-- Claim any runnable run of the tenant: a lease that expired (by database
-- time) first, then a queued run whose next_attempt_at has come. Rows other
-- sessions hold are skipped, never waited for.
CREATE FUNCTION fencecheck.claim(p_owner text, p_ttl_ms bigint)
RETURNS SETOF fencecheck.lease_grant
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := clock_timestamp();  -- a value, so the partial indexes apply
  v_id uuid;
  v_prev_owner text;
  v_prev_expiry timestamptz;
BEGIN
  PERFORM fencecheck._ms(p_ttl_ms);
  SELECT r.run_id, r.owner, r.lease_expires_at INTO v_id, v_prev_owner, v_prev_expiry
    FROM public.agent_runs r
   WHERE r.status IN ('running', 'waiting_tool') AND r.lease_expires_at <= v_now
   ORDER BY r.lease_expires_at
   LIMIT 1
     FOR UPDATE SKIP LOCKED;
  IF NOT FOUND THEN
    SELECT r.run_id INTO v_id
      FROM public.agent_runs r
     WHERE r.status = 'queued' AND r.next_attempt_at <= v_now
     ORDER BY r.next_attempt_at, r.created_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
      RETURN;
    END IF;
  END IF;
  RETURN NEXT fencecheck._grant(v_id, p_owner, p_ttl_ms, v_prev_owner, v_prev_expiry, 0);
END
$$;

-- Targeted takeover of one run: WAITS on the row lock (no SKIP LOCKED), so a
-- protected write in progress finishes (or aborts) before the decision.
CREATE FUNCTION fencecheck.takeover(p_run_id uuid, p_owner text, p_ttl_ms bigint)
RETURNS fencecheck.lease_grant
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  r public.agent_runs%ROWTYPE;
  v_wait double precision;
  v_now timestamptz;
  g fencecheck.lease_grant;
BEGIN
  PERFORM fencecheck._ms(p_ttl_ms);
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = p_run_id FOR UPDATE;
  v_now := clock_timestamp();
  v_wait := (extract(epoch FROM v_now - t0) * 1000)::float8;
  IF NOT FOUND THEN
    g.outcome := 'missing'; g.run_id := p_run_id; g.lock_wait_ms := v_wait;
    RETURN g;
  END IF;
  g := ROW(NULL, r.run_id, r.owner, r.epoch, r.revision, r.status, r.lease_expires_at,
           NULL, NULL, v_wait)::fencecheck.lease_grant;
  IF r.status IN ('succeeded', 'failed', 'cancelled') THEN
    g.outcome := 'terminal';
  ELSIF r.status IN ('paused_indoubt', 'paused_human') THEN
    g.outcome := 'paused';
  ELSIF r.status = 'queued' AND r.next_attempt_at > v_now THEN
    g.outcome := 'not_due';
  ELSIF r.status IN ('running', 'waiting_tool') AND r.lease_expires_at > v_now THEN
    g.outcome := 'held';
  ELSE
    RETURN fencecheck._grant(r.run_id, p_owner, p_ttl_ms,
                             r.owner, r.lease_expires_at, v_wait);
  END IF;
  RETURN g;
END
$$;

-- Why a lease statement matched zero rows (read without a lock: advisory).
CREATE FUNCTION fencecheck._lease_miss(p_run_id uuid, p_owner text, p_epoch bigint)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r public.agent_runs%ROWTYPE;
BEGIN
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = p_run_id;
  IF NOT FOUND THEN RETURN 'missing'; END IF;
  IF r.status IN ('succeeded', 'failed', 'cancelled') THEN RETURN 'terminal'; END IF;
  IF r.owner IS DISTINCT FROM p_owner OR r.epoch <> p_epoch THEN RETURN 'lost'; END IF;
  IF r.lease_expires_at <= clock_timestamp() THEN RETURN 'expired'; END IF;
  RETURN 'lost';
END
$$;

-- Renew only while owner AND epoch match AND the lease is unexpired: an
-- expired lease nobody took over yet can never be revived.
CREATE FUNCTION fencecheck.renew(p_run_id uuid, p_owner text, p_epoch bigint, p_ttl_ms bigint)
RETURNS TABLE (outcome text, lease_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_exp timestamptz;
BEGIN
  UPDATE public.agent_runs r
     SET lease_expires_at = clock_timestamp() + fencecheck._ms(p_ttl_ms),
         updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id AND r.owner = p_owner AND r.epoch = p_epoch
     AND r.lease_expires_at > clock_timestamp()
     AND r.status IN ('running', 'waiting_tool')
  RETURNING r.lease_expires_at INTO v_exp;
  IF FOUND THEN
    RETURN QUERY SELECT 'renewed'::text, v_exp;
  ELSE
    RETURN QUERY SELECT fencecheck._lease_miss(p_run_id, p_owner, p_epoch), NULL::timestamptz;
  END IF;
END
$$;

-- Release gives the run back to the queue at once. The epoch is kept: the
-- next grant makes it epoch + 1, so a stale holder stays fenced.
CREATE FUNCTION fencecheck.release(p_run_id uuid, p_owner text, p_epoch bigint)
RETURNS TABLE (outcome text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.agent_runs r
     SET owner = NULL, lease_expires_at = NULL, status = 'queued',
         next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id AND r.owner = p_owner AND r.epoch = p_epoch
     AND r.status IN ('running', 'waiting_tool');
  IF FOUND THEN
    RETURN QUERY SELECT 'released'::text;
  ELSE
    RETURN QUERY SELECT fencecheck._lease_miss(p_run_id, p_owner, p_epoch);
  END IF;
END
$$;

-- ------------------------------------------------------------ protected writes (rules 2, 3)

-- Lock the lease row (waiting for any other holder of the lock), then
-- validate owner + epoch + unexpired by database time. Raises on failure.
CREATE FUNCTION fencecheck.lock_lease(p_run_id uuid, p_owner text, p_epoch bigint)
RETURNS TABLE (revision bigint, status text, current_step text, lock_wait_ms double precision)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  r public.agent_runs%ROWTYPE;
BEGIN
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'FC003';
  END IF;
  IF r.owner IS DISTINCT FROM p_owner OR r.epoch <> p_epoch THEN
    RAISE EXCEPTION 'lease of run % lost', p_run_id USING ERRCODE = 'FC001',
      DETAIL = format('status=%s epoch=%s', r.status, r.epoch);
  END IF;
  IF r.lease_expires_at <= clock_timestamp() THEN
    RAISE EXCEPTION 'lease of run % expired', p_run_id USING ERRCODE = 'FC002',
      DETAIL = format('status=%s epoch=%s', r.status, r.epoch);
  END IF;
  RETURN QUERY SELECT r.revision, r.status, r.current_step,
                      (extract(epoch FROM clock_timestamp() - t0) * 1000)::float8;
END
$$;

-- Register a side-effect intent as 'prepared'. A primary-key conflict is the
-- same intent only when run, tool and request digest all match.
CREATE FUNCTION fencecheck._ledger_register_intent(p_run_id uuid, p_tenant uuid, p_effect jsonb)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  o public.tool_operations%ROWTYPE;
BEGIN
  INSERT INTO public.tool_operations (
    operation_id, tenant_id, run_id, step_id, effect_version, tool_name, tool_capability,
    idempotency_key, request_digest, request_body, status)
  VALUES (
    p_effect->>'operation_id', p_tenant, p_run_id, p_effect->>'step_id',
    (p_effect->>'effect_version')::integer, p_effect->>'tool_name', p_effect->>'tool_capability',
    p_effect->>'idempotency_key', p_effect->>'request_digest', p_effect->'request_body', 'prepared')
  ON CONFLICT DO NOTHING;
  IF FOUND THEN
    RETURN 'prepared';
  END IF;
  SELECT * INTO o FROM public.tool_operations x WHERE x.operation_id = p_effect->>'operation_id';
  IF NOT FOUND OR o.run_id <> p_run_id OR o.tool_name <> p_effect->>'tool_name'
     OR o.request_digest <> p_effect->>'request_digest' THEN
    RAISE EXCEPTION 'intent % conflicts with a different registered intent', p_effect->>'operation_id'
      USING ERRCODE = 'FC006';
  END IF;
  RETURN o.status;  -- the same intent, registered before
END
$$;

-- Tx2's ledger half: record the tool's answer only for the dispatch claim
-- that sent it (dispatch owner + ledger revision + request digest), or adopt
-- a result the ledger already holds for this run.
CREATE FUNCTION fencecheck._ledger_tool_result(p_run_id uuid, p_effect jsonb)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  o public.tool_operations%ROWTYPE;
BEGIN
  IF p_effect->>'mode' = 'adopt' THEN
    SELECT * INTO o FROM public.tool_operations x
     WHERE x.operation_id = p_effect->>'operation_id' AND x.run_id = p_run_id;
    IF NOT FOUND OR o.status NOT IN ('succeeded', 'failed_final') THEN
      RAISE EXCEPTION 'operation % has no final result to adopt', p_effect->>'operation_id'
        USING ERRCODE = 'FC007', DETAIL = format('status=%s', o.status);
    END IF;
    RETURN o.status;
  END IF;
  UPDATE public.tool_operations x
     SET status = p_effect->>'outcome', remote_id = p_effect->>'remote_id',
         result = p_effect->'result', dispatch_until = NULL,
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_effect->>'operation_id' AND x.run_id = p_run_id
     AND x.status = 'dispatching'
     AND x.dispatch_owner = p_effect->>'dispatch_owner'
     AND x.revision = (p_effect->>'ledger_revision')::bigint
     AND x.request_digest = p_effect->>'request_digest'
     AND p_effect->>'outcome' IN ('succeeded', 'failed_final')
  RETURNING x.* INTO o;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'ledger row % does not match the dispatch claim', p_effect->>'operation_id'
      USING ERRCODE = 'FC007',
            DETAIL = fencecheck._ledger_miss(p_effect->>'operation_id', p_effect->>'dispatch_owner',
                                             (p_effect->>'ledger_revision')::bigint,
                                             p_effect->>'request_digest');
  END IF;
  RETURN o.status;
END
$$;

-- Freeze's ledger half: our own live claim becomes unknown (never prepared).
CREATE FUNCTION fencecheck._ledger_freeze(p_run_id uuid, p_effect jsonb)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_status text;
BEGIN
  IF p_effect IS NULL OR p_effect->>'operation_id' IS NULL THEN
    RETURN NULL;
  END IF;
  UPDATE public.tool_operations x
     SET status = CASE WHEN x.status = 'dispatching'
                        AND x.dispatch_owner = p_effect->>'dispatch_owner'
                        AND x.revision = (p_effect->>'ledger_revision')::bigint
                       THEN 'unknown' ELSE x.status END,
         dispatch_owner = CASE WHEN x.status = 'dispatching'
                        AND x.dispatch_owner = p_effect->>'dispatch_owner'
                        AND x.revision = (p_effect->>'ledger_revision')::bigint
                       THEN NULL ELSE x.dispatch_owner END,
         dispatch_until = CASE WHEN x.status = 'dispatching'
                        AND x.dispatch_owner = p_effect->>'dispatch_owner'
                        AND x.revision = (p_effect->>'ledger_revision')::bigint
                       THEN NULL ELSE x.dispatch_until END,
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
                      'at', clock_timestamp(), 'event', 'run_frozen', 'error', p_effect->'error')),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_effect->>'operation_id' AND x.run_id = p_run_id
  RETURNING x.status INTO v_status;
  RETURN v_status;
END
$$;

CREATE FUNCTION fencecheck._ledger_miss(p_operation_id text, p_dispatch_owner text,
                                        p_revision bigint, p_digest text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  o public.tool_operations%ROWTYPE;
BEGIN
  SELECT * INTO o FROM public.tool_operations x WHERE x.operation_id = p_operation_id;
  IF NOT FOUND THEN RETURN 'missing'; END IF;
  IF o.status <> 'dispatching' THEN RETURN 'not_dispatching:' || o.status; END IF;
  IF o.dispatch_owner IS DISTINCT FROM p_dispatch_owner THEN RETURN 'owner_mismatch'; END IF;
  IF o.revision <> p_revision THEN RETURN 'revision_mismatch'; END IF;
  IF o.request_digest <> p_digest THEN RETURN 'digest_mismatch'; END IF;
  RETURN 'mismatch';
END
$$;

-- Status after a protected transition (the state machine of both seeds).
CREATE FUNCTION fencecheck._next_status(p_transition text, p_status text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN CASE p_transition
    WHEN 'start' THEN 'running'
    WHEN 'checkpoint' THEN p_status
    WHEN 'intent' THEN 'waiting_tool'
    WHEN 'tool_result' THEN 'running'
    WHEN 'succeed' THEN 'succeeded'
    WHEN 'fail' THEN 'failed'
    WHEN 'freeze' THEN 'paused_indoubt'
    WHEN 'pause_human' THEN 'paused_human'
    WHEN 'requeue' THEN 'queued'
  END;
END
$$;

-- The protected write: in ONE transaction lock the lease row and validate
-- owner + epoch + unexpired (lock_lease), CAS the revision, apply the
-- transition's ledger change, and insert the checkpoint and the outbox row.
-- Terminal, frozen, paused and requeued runs give the lease up (epoch kept).
CREATE FUNCTION fencecheck.protected_write(
  p_run_id uuid, p_owner text, p_epoch bigint, p_expected_revision bigint,
  p_transition text, p_state jsonb, p_state_hash bytea, p_schema_version integer,
  p_current_step text, p_event_id uuid, p_event_type text, p_payload jsonb,
  p_effect jsonb DEFAULT NULL)
RETURNS TABLE (revision bigint, status text, lock_wait_ms double precision, ledger_status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_lock record;
  v_status text;
  v_gives_up boolean;
  v_backoff interval;
  v_reason text;
  v_run public.agent_runs%ROWTYPE;
  v_ledger text;
BEGIN
  SELECT * INTO v_lock FROM fencecheck.lock_lease(p_run_id, p_owner, p_epoch);
  v_status := fencecheck._next_status(p_transition, v_lock.status);
  IF v_status IS NULL THEN
    RAISE EXCEPTION 'unknown transition %', p_transition USING ERRCODE = '22023';
  END IF;
  v_gives_up := v_status NOT IN ('running', 'waiting_tool');
  v_reason := CASE WHEN v_gives_up THEN p_payload->>'reason' END;
  IF p_transition = 'requeue' THEN
    v_backoff := fencecheck._ms(GREATEST(1, COALESCE((p_effect->>'backoff_ms')::bigint, 1)));
  END IF;
  UPDATE public.agent_runs r
     SET revision = r.revision + 1,
         status = CASE WHEN p_transition = 'requeue' AND r.attempt_count >= r.max_attempts
                       THEN 'failed' ELSE v_status END,
         terminal_reason = CASE WHEN p_transition = 'requeue' AND r.attempt_count >= r.max_attempts
                                THEN 'attempts_exhausted' ELSE COALESCE(v_reason, r.terminal_reason) END,
         owner = CASE WHEN v_gives_up THEN NULL ELSE r.owner END,
         lease_expires_at = CASE WHEN v_gives_up THEN NULL ELSE r.lease_expires_at END,
         next_attempt_at = CASE WHEN p_transition = 'requeue'
                                THEN clock_timestamp() + v_backoff ELSE r.next_attempt_at END,
         current_step = COALESCE(p_current_step, r.current_step),
         checkpoint_schema_version = p_schema_version,
         updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id AND r.revision = p_expected_revision
  RETURNING r.* INTO v_run;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % revision is not %', p_run_id, p_expected_revision
      USING ERRCODE = 'FC005', DETAIL = format('revision=%s', v_lock.revision);
  END IF;
  v_ledger := CASE p_transition
    WHEN 'intent' THEN fencecheck._ledger_register_intent(p_run_id, v_run.tenant_id, p_effect)
    WHEN 'tool_result' THEN fencecheck._ledger_tool_result(p_run_id, p_effect)
    WHEN 'freeze' THEN fencecheck._ledger_freeze(p_run_id, p_effect)
  END;
  INSERT INTO public.agent_checkpoints (run_id, revision, tenant_id, epoch, owner, transition,
                                        state_json, state_hash, schema_version, event_id)
  VALUES (p_run_id, v_run.revision, v_run.tenant_id, p_epoch, p_owner, p_transition,
          p_state, p_state_hash, p_schema_version, p_event_id);
  INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
  VALUES (p_event_id, v_run.tenant_id, p_run_id, p_event_type, p_payload);
  RETURN QUERY SELECT v_run.revision, v_run.status, v_lock.lock_wait_ms, v_ledger;
END
$$;

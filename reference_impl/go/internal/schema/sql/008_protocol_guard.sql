-- The protocol, guarded by the database for every session that is not a
-- superuser (worker contract section 7, "what the worker role can write").
--
-- The seeds' protocol is plain SQL run by the worker (internal/protocol), so
-- the worker role holds INSERT and column UPDATE rights on the protocol
-- tables, and PostgreSQL cannot tell the worker's statements from any other
-- statement a session of that role sends. 004 guarded the fencing token
-- only. These triggers replace it and hold EVERY write of a non-superuser
-- session to the protocol, whatever SQL it sends:
--
--   agent_runs        a change is exactly one of: a lease grant (epoch + 1
--                     over a free or expired lease of a runnable run), a
--                     renewal of a live lease, a release, a protected write
--                     (revision + 1 under the lease, unexpired when the
--                     writing transaction began (contract section 11), with the
--                     checkpoint and outbox row of that revision, written
--                     under that lease's owner and epoch, in the same
--                     transaction: checked at COMMIT), the reconciler's
--                     resume of a run paused in doubt with nothing left in
--                     doubt, or (operator group only) a control-plane move
--                     of the state table: cancel, resolve, approve,
--                     supplement, terminate. Nothing else.
--   agent_checkpoints insert only (no UPDATE/DELETE right), of the run's new
--                     revision and epoch, by the worker group.
--   outbox            insert only with the checkpoint of the same event_id
--                     inserted in the same transaction (worker), or with a
--                     control-plane move of its run (operator); the one
--                     update is marking a row published, once.
--   tool_operations   insert (worker) only as part of a protected write of
--                     its run (checked at COMMIT), prepared, a new effect
--                     version only when every earlier one is definitely
--                     without effect; identity, request and promise never
--                     change; evidence only grows; status moves only along
--                     the ledger's edges (a same-key retry only for a tool
--                     that promises it, while the run is live and inside the
--                     tool's key retention; never unknown -> prepared; only
--                     the operator cancels a prepared one).
--
-- Who is writing is judged from session_user (which a session cannot
-- change): a member of fencecheck_operator is the control plane, every
-- other non-superuser is held to the worker's rules. The trigger functions
-- call no helper function: the worker role may execute no function but
-- session_tenant (contract section 7), and trigger functions need no
-- EXECUTE right to fire. Refusals: SQLSTATE FC012 (fencing, lease,
-- revision), FC004 (state), FC006 (ledger), FC013 (control plane).

DROP TRIGGER agent_runs_fence_guard ON public.agent_runs;
DROP FUNCTION fencecheck.guard_fence();

-- ------------------------------------------------------------ agent_runs

CREATE FUNCTION fencecheck.guard_run() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_actor text := CASE WHEN current_setting('is_superuser') = 'on' THEN 'superuser'
                       WHEN pg_has_role(session_user, 'fencecheck_operator', 'MEMBER') THEN 'operator'
                       ELSE 'worker' END;
  v_now timestamptz := clock_timestamp();
  v_live boolean := OLD.owner IS NOT NULL AND OLD.lease_expires_at > v_now;
  v_holding constant text[] := ARRAY['running', 'waiting_tool'];
  v_terminal constant text[] := ARRAY['succeeded', 'failed', 'cancelled'];
  -- the columns a lease change (grant, renew, release) never touches
  v_same_work boolean := NEW.revision = OLD.revision AND NEW.input = OLD.input
    AND NEW.max_attempts = OLD.max_attempts AND NEW.current_step IS NOT DISTINCT FROM OLD.current_step
    AND NEW.checkpoint_schema_version IS NOT DISTINCT FROM OLD.checkpoint_schema_version
    AND NEW.terminal_reason IS NOT DISTINCT FROM OLD.terminal_reason;
BEGIN
  IF v_actor = 'superuser' THEN
    RETURN NEW;  -- the harness planting evidence (experiment M), migrations
  END IF;
  IF TG_OP = 'INSERT' THEN
    -- a new run (control plane): queued, revision 0, epoch 0, no lease
    IF v_actor <> 'operator' OR NEW.status <> 'queued' OR NEW.revision <> 0 OR NEW.epoch <> 0
       OR NEW.owner IS NOT NULL OR NEW.attempt_count <> 0 THEN
      RAISE EXCEPTION 'run %: a new run is created queued at revision 0 and epoch 0 by the control plane',
        NEW.run_id USING ERRCODE = 'FC013';
    END IF;
    RETURN NEW;
  END IF;
  IF (NEW.run_id, NEW.tenant_id, NEW.task_id, NEW.created_at)
     IS DISTINCT FROM (OLD.run_id, OLD.tenant_id, OLD.task_id, OLD.created_at)
     OR NEW.retry_of IS DISTINCT FROM OLD.retry_of THEN
    RAISE EXCEPTION 'run %: identity, tenant and task never change', OLD.run_id USING ERRCODE = 'FC012';
  END IF;
  IF OLD.status = ANY (v_terminal) AND (NEW.status, NEW.revision, NEW.epoch, NEW.owner)
       IS DISTINCT FROM (OLD.status, OLD.revision, OLD.epoch, OLD.owner) THEN
    RAISE EXCEPTION 'run % is % (terminal) and cannot change', OLD.run_id, OLD.status
      USING ERRCODE = 'FC004';
  END IF;

  IF NEW.epoch <> OLD.epoch THEN
    -- A grant (claim or takeover), English seed 5.1 / Chinese seed 5.
    IF v_actor <> 'worker' OR NEW.epoch <> OLD.epoch + 1
       OR NOT ((OLD.status = 'queued' AND OLD.next_attempt_at <= v_now)
               OR (OLD.status = ANY (v_holding) AND NOT v_live))
       OR NEW.owner IS NULL OR NOT NEW.lease_expires_at > v_now
       OR NEW.status <> (CASE WHEN OLD.status = 'queued' THEN 'running' ELSE OLD.status END)
       OR NEW.attempt_count <> OLD.attempt_count + (CASE WHEN OLD.status = 'queued' THEN 1 ELSE 0 END)
       OR NEW.next_attempt_at <> OLD.next_attempt_at OR NOT v_same_work THEN
      RAISE EXCEPTION 'fencing token of run % may only go % -> % in a grant over a free or expired lease',
        OLD.run_id, OLD.epoch, OLD.epoch + 1 USING ERRCODE = 'FC012',
        DETAIL = format('asked epoch %s (%s); run %s, lease of %s until %s', NEW.epoch, v_actor,
                        OLD.status, OLD.owner, OLD.lease_expires_at);
    END IF;
    RETURN NEW;
  END IF;

  IF NEW.revision <> OLD.revision THEN
    -- A protected write: revision + 1 under the lease, unexpired when this
    -- transaction began (a writer that validated its lease and holds the
    -- row lock may commit after the expiry: nobody could take over
    -- meanwhile, experiment D). Its checkpoint and outbox row are checked
    -- at COMMIT (check_run_write below).
    IF v_actor <> 'worker' OR NEW.revision <> OLD.revision + 1
       OR OLD.owner IS NULL OR NOT OLD.lease_expires_at > now() THEN
      RAISE EXCEPTION 'revision of run % may only go % -> % under the live lease',
        OLD.run_id, OLD.revision, OLD.revision + 1 USING ERRCODE = 'FC012',
        DETAIL = format('asked revision %s (%s); lease of %s epoch %s until %s', NEW.revision, v_actor,
                        OLD.owner, OLD.epoch, OLD.lease_expires_at);
    END IF;
    IF NOT ((NEW.owner = OLD.owner AND NEW.lease_expires_at = OLD.lease_expires_at
             AND NEW.status = ANY (v_holding))
            OR (NEW.owner IS NULL AND NEW.status IN ('queued', 'succeeded', 'failed',
                                                     'paused_indoubt', 'paused_human')))
       OR NEW.attempt_count <> OLD.attempt_count OR NEW.max_attempts <> OLD.max_attempts
       OR NEW.input <> OLD.input
       OR (NEW.next_attempt_at <> OLD.next_attempt_at AND NEW.status <> 'queued') THEN
      RAISE EXCEPTION 'run %: a protected write cannot go from % to % that way', OLD.run_id,
        OLD.status, NEW.status USING ERRCODE = 'FC004';
    END IF;
    RETURN NEW;
  END IF;

  IF (NEW.owner, NEW.lease_expires_at, NEW.status, NEW.attempt_count, NEW.next_attempt_at)
     IS NOT DISTINCT FROM (OLD.owner, OLD.lease_expires_at, OLD.status, OLD.attempt_count,
                           OLD.next_attempt_at) AND v_same_work THEN
    RETURN NEW;  -- nothing of the protocol changed
  END IF;
  IF v_actor = 'worker' AND v_live AND v_same_work AND NEW.status = OLD.status
     AND NEW.owner = OLD.owner AND NEW.lease_expires_at > v_now
     AND NEW.attempt_count = OLD.attempt_count AND NEW.next_attempt_at = OLD.next_attempt_at THEN
    RETURN NEW;  -- renewal of the live lease
  END IF;
  IF v_actor = 'worker' AND OLD.status = ANY (v_holding) AND v_same_work AND NEW.owner IS NULL
     AND NEW.lease_expires_at IS NULL AND NEW.status = 'queued'
     AND NEW.attempt_count = OLD.attempt_count THEN
    -- release: back to the queue, epoch kept. Also of a lease that expired
    -- with nobody taking over (the reference implementation's release
    -- allows it, H releases after waiting for the replication link): it
    -- hands the run to whoever claims next, as a takeover would.
    RETURN NEW;
  END IF;
  IF OLD.status = 'paused_indoubt' AND NEW.status = 'queued' AND EXISTS (
       SELECT 1 FROM public.tool_operations o
        WHERE o.run_id = OLD.run_id AND o.status IN ('unknown', 'dispatching')) THEN
    RAISE EXCEPTION 'run % has an operation still in doubt: it is queued again only once that converged',
      OLD.run_id USING ERRCODE = 'FC004';
  END IF;
  IF v_actor = 'worker' AND OLD.status = 'paused_indoubt' AND NEW.status = 'queued'
     AND NEW.owner IS NULL AND v_same_work AND NEW.attempt_count = OLD.attempt_count THEN
    RETURN NEW;  -- the reconciler's resume: nothing of the run is in doubt any more
  END IF;
  IF v_actor = 'operator' AND NEW.owner IS NULL AND NEW.lease_expires_at IS NULL
     AND NEW.revision = OLD.revision AND NEW.attempt_count = OLD.attempt_count
     AND NEW.current_step IS NOT DISTINCT FROM OLD.current_step
     AND NEW.checkpoint_schema_version IS NOT DISTINCT FROM OLD.checkpoint_schema_version
     AND (NEW.status, OLD.status) IN (
       ('cancelled', 'queued'), ('cancelled', 'running'), ('cancelled', 'waiting_tool'),
       ('cancelled', 'paused_indoubt'), ('cancelled', 'paused_human'),
       ('queued', 'paused_indoubt'), ('queued', 'paused_human'),
       ('failed', 'paused_indoubt'), ('failed', 'paused_human'))
     -- only approve/supplement change input (the supplement) and the budget (one more attempt)
     AND (NEW.input - 'supplement') = (OLD.input - 'supplement')
     AND (NEW.input = OLD.input OR (OLD.status = 'paused_human' AND NEW.status = 'queued'))
     AND (NEW.max_attempts = OLD.max_attempts
          OR (OLD.status = 'paused_human' AND NEW.status = 'queued' AND NEW.max_attempts > OLD.max_attempts))
     AND (NEW.next_attempt_at = OLD.next_attempt_at OR NEW.status = 'queued')
     AND (NEW.terminal_reason IS NOT DISTINCT FROM OLD.terminal_reason
          OR NEW.status IN ('failed', 'cancelled')) THEN
    RETURN NEW;  -- a control-plane move of the state table
  END IF;
  RAISE EXCEPTION 'run %: % -> % is not a move this session may make', OLD.run_id, OLD.status, NEW.status
    USING ERRCODE = CASE WHEN v_actor = 'worker' THEN 'FC013' ELSE 'FC004' END,
          DETAIL = format('%s session %s; lease of %s epoch %s until %s', v_actor, session_user,
                          OLD.owner, OLD.epoch, OLD.lease_expires_at);
END
$$;
CREATE TRIGGER agent_runs_guard BEFORE INSERT OR UPDATE ON public.agent_runs
  FOR EACH ROW EXECUTE FUNCTION fencecheck.guard_run();

-- At COMMIT, for every change of a run's revision in the transaction: it is
-- the run's last (one protected write per transaction), and the checkpoint
-- of that revision carries the owner and epoch of the lease it was written
-- under, with an outbox row of the same event_id. A deferred constraint
-- trigger: SET CONSTRAINTS ... IMMEDIATE only makes it fire earlier.
CREATE FUNCTION fencecheck.check_run_write() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_revision bigint;
  c record;
BEGIN
  IF current_setting('is_superuser') = 'on' THEN
    RETURN NULL;
  END IF;
  SELECT r.revision INTO v_revision FROM public.agent_runs r WHERE r.run_id = NEW.run_id;
  SELECT k.owner, k.epoch, k.event_id INTO c FROM public.agent_checkpoints k
   WHERE k.run_id = NEW.run_id AND k.revision = NEW.revision;
  IF v_revision IS DISTINCT FROM NEW.revision OR c.event_id IS NULL
     OR c.owner IS DISTINCT FROM OLD.owner OR c.epoch IS DISTINCT FROM OLD.epoch
     OR NOT EXISTS (SELECT 1 FROM public.outbox x
                     WHERE x.event_id = c.event_id AND x.run_id = NEW.run_id) THEN
    RAISE EXCEPTION 'run % revision %: not one protected write under the lease of % epoch %',
      NEW.run_id, NEW.revision, OLD.owner, OLD.epoch USING ERRCODE = 'FC012',
      DETAIL = format('run revision at commit %s; checkpoint %s', v_revision,
                      CASE WHEN c.event_id IS NULL THEN 'missing'
                           ELSE format('by %s epoch %s, event %s', c.owner, c.epoch, c.event_id) END);
  END IF;
  RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER agent_runs_write_check AFTER UPDATE ON public.agent_runs
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (NEW.revision IS DISTINCT FROM OLD.revision)
  EXECUTE FUNCTION fencecheck.check_run_write();

-- ------------------------------------------------------------ agent_checkpoints

CREATE FUNCTION fencecheck.guard_checkpoint() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
BEGIN
  IF current_setting('is_superuser') = 'on' THEN
    RETURN NEW;
  END IF;
  SELECT x.revision, x.epoch, x.tenant_id INTO r FROM public.agent_runs x WHERE x.run_id = NEW.run_id;
  IF pg_has_role(session_user, 'fencecheck_operator', 'MEMBER') OR r.revision IS NULL
     OR NEW.revision <> r.revision OR NEW.epoch <> r.epoch OR NEW.tenant_id <> r.tenant_id THEN
    RAISE EXCEPTION 'checkpoint % of run % is not the new revision of a protected write',
      NEW.revision, NEW.run_id USING ERRCODE = 'FC012',
      DETAIL = format('run at revision %s epoch %s; checkpoint epoch %s', r.revision, r.epoch, NEW.epoch);
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER agent_checkpoints_guard BEFORE INSERT ON public.agent_checkpoints
  FOR EACH ROW EXECUTE FUNCTION fencecheck.guard_checkpoint();

-- ------------------------------------------------------------ outbox

CREATE FUNCTION fencecheck.guard_outbox() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF current_setting('is_superuser') = 'on' THEN
    RETURN NEW;
  END IF;
  IF TG_OP = 'UPDATE' THEN
    IF OLD.published_at IS NOT NULL OR NEW.published_at IS NULL
       OR (NEW.id, NEW.event_id, NEW.tenant_id, NEW.run_id, NEW.event_type, NEW.payload, NEW.created_at)
          IS DISTINCT FROM (OLD.id, OLD.event_id, OLD.tenant_id, OLD.run_id, OLD.event_type,
                            OLD.payload, OLD.created_at) THEN
      RAISE EXCEPTION 'outbox row %: only marking it published, once', OLD.id USING ERRCODE = 'FC012';
    END IF;
    RETURN NEW;
  END IF;
  IF NEW.published_at IS NOT NULL THEN
    RAISE EXCEPTION 'an outbox row is published by the relay, not born published' USING ERRCODE = 'FC012';
  END IF;
  IF NEW.event_type = 'agent.compensation_required' AND EXISTS (
       SELECT 1 FROM public.tool_operations o
        WHERE o.operation_id = NEW.payload->>'operation_id' AND o.run_id = NEW.run_id
          AND o.status = 'succeeded' AND o.xmin = pg_current_xact_id()::xid) THEN
    -- the compensation of the success this transaction recorded (012), by a
    -- worker's result or a control plane's reconcile, callback or convergence
    RETURN NEW;
  END IF;
  IF pg_has_role(session_user, 'fencecheck_operator', 'MEMBER') THEN
    -- a control-plane move's event: the move is in this transaction
    IF NEW.event_type LIKE 'agent.%' AND EXISTS (
         SELECT 1 FROM public.agent_runs r
          WHERE r.run_id = NEW.run_id AND r.xmin = pg_current_xact_id()::xid) THEN
      RETURN NEW;
    END IF;
  ELSIF EXISTS (SELECT 1 FROM public.agent_checkpoints c
                 WHERE c.event_id = NEW.event_id AND c.run_id = NEW.run_id
                   AND c.xmin = pg_current_xact_id()::xid) THEN
    RETURN NEW;  -- the event of the checkpoint this transaction wrote
  END IF;
  RAISE EXCEPTION 'outbox event % of run % belongs to no write of this transaction',
    NEW.event_id, NEW.run_id USING ERRCODE = 'FC012';
END
$$;
CREATE TRIGGER outbox_guard BEFORE INSERT OR UPDATE ON public.outbox
  FOR EACH ROW EXECUTE FUNCTION fencecheck.guard_outbox();

-- ------------------------------------------------------------ tool_operations

CREATE FUNCTION fencecheck.guard_ledger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_operator boolean := pg_has_role(session_user, 'fencecheck_operator', 'MEMBER');
  v_run text;
  v_ok boolean;
BEGIN
  IF current_setting('is_superuser') = 'on' THEN
    IF TG_OP = 'UPDATE' AND NEW.status = 'dispatching' AND NEW.first_dispatched_at IS NULL THEN
      NEW.first_dispatched_at := clock_timestamp();
    END IF;
    RETURN NEW;
  END IF;
  SELECT r.status INTO v_run FROM public.agent_runs r WHERE r.run_id = NEW.run_id;
  IF TG_OP = 'INSERT' THEN
    -- Tx1: an intent, prepared, in a protected write of its run (checked at COMMIT)
    IF v_operator OR v_run IS NULL OR NEW.status <> 'prepared' OR NEW.revision <> 0
       OR NEW.dispatch_owner IS NOT NULL OR NEW.dispatch_until IS NOT NULL
       OR NEW.remote_id IS NOT NULL OR NEW.result IS NOT NULL OR NEW.evidence <> '[]'::jsonb
       OR NEW.first_dispatched_at IS NOT NULL THEN
      RAISE EXCEPTION 'operation %: an intent is registered prepared, by a protected write',
        NEW.operation_id USING ERRCODE = 'FC006';
    END IF;
    -- English seed 9.3: a changed or re-planned effect is a new version, and
    -- never runs beside an earlier one that may have happened.
    IF EXISTS (SELECT 1 FROM public.tool_operations x
                WHERE x.run_id = NEW.run_id AND x.step_id = NEW.step_id
                  AND x.effect_version < NEW.effect_version
                  AND NOT (x.status = 'cancelled'
                           OR (x.status = 'failed_final'
                               AND COALESCE(x.result->>'executed', 'false') = 'false'))) THEN
      RAISE EXCEPTION 'step % of run %: an earlier effect version may have happened',
        NEW.step_id, NEW.run_id USING ERRCODE = 'FC006';
    END IF;
    RETURN NEW;
  END IF;

  IF (NEW.operation_id, NEW.tenant_id, NEW.run_id, NEW.step_id, NEW.effect_version, NEW.tool_name,
      NEW.tool_capability, NEW.idempotency_key, NEW.request_digest, NEW.request_body,
      NEW.retention_ms, NEW.created_at, NEW.first_dispatched_at)
     IS DISTINCT FROM (OLD.operation_id, OLD.tenant_id, OLD.run_id, OLD.step_id, OLD.effect_version,
      OLD.tool_name, OLD.tool_capability, OLD.idempotency_key, OLD.request_digest, OLD.request_body,
      OLD.retention_ms, OLD.created_at, OLD.first_dispatched_at)
     OR jsonb_typeof(NEW.evidence) <> 'array'
     OR jsonb_array_length(NEW.evidence) < jsonb_array_length(OLD.evidence)
     OR (SELECT COALESCE(jsonb_agg(e.v ORDER BY e.i), '[]'::jsonb)
           FROM jsonb_array_elements(NEW.evidence) WITH ORDINALITY AS e(v, i)
          WHERE e.i <= jsonb_array_length(OLD.evidence)) <> OLD.evidence THEN
    RAISE EXCEPTION 'operation %: identity, request and promise never change; evidence only grows',
      OLD.operation_id USING ERRCODE = 'FC006';
  END IF;
  IF NEW.status = OLD.status THEN
    IF (NEW.dispatch_owner, NEW.dispatch_until, NEW.remote_id, NEW.result, NEW.revision)
       IS DISTINCT FROM (OLD.dispatch_owner, OLD.dispatch_until, OLD.remote_id, OLD.result, OLD.revision) THEN
      RAISE EXCEPTION 'operation % is % and stays so: only evidence may be added', OLD.operation_id,
        OLD.status USING ERRCODE = 'FC006';
    END IF;
    RETURN NEW;
  END IF;
  v_ok := NEW.revision = OLD.revision + 1 AND CASE
    -- the dispatcher's claim (English seed 9.2): an intent of a live run
    WHEN OLD.status = 'prepared' AND NEW.status = 'dispatching' THEN
      v_run IN ('queued', 'running', 'waiting_tool')
      AND NEW.dispatch_owner IS NOT NULL AND NEW.dispatch_until > clock_timestamp()
    -- a same-key retry: only a tool that promises it, while the run is live
    -- and before the tool's declared key retention runs out
    WHEN OLD.status = 'unknown' AND NEW.status = 'dispatching' THEN
      v_run IN ('queued', 'running', 'waiting_tool')
      AND OLD.tool_capability IN ('idempotent', 'deterministic_id')
      AND NEW.dispatch_owner IS NOT NULL AND NEW.dispatch_until > clock_timestamp()
      AND (OLD.tool_capability <> 'idempotent' OR OLD.retention_ms IS NULL OR OLD.first_dispatched_at IS NULL
           OR NEW.dispatch_until < OLD.first_dispatched_at + OLD.retention_ms * interval '1 millisecond')
    -- an answer (Tx2, the dispatcher's record, a callback), or a convergence
    WHEN OLD.status IN ('dispatching', 'unknown') AND NEW.status IN ('succeeded', 'failed_final') THEN
      NEW.status = 'failed_final' OR NEW.remote_id IS NOT NULL
    -- no answer: the remote may have acted (never back to prepared from here)
    WHEN OLD.status = 'dispatching' AND NEW.status = 'unknown' THEN true
    -- the tool's proof it did not act (429): the intent may go again
    WHEN OLD.status = 'dispatching' AND NEW.status = 'prepared' THEN
      jsonb_array_length(NEW.evidence) > jsonb_array_length(OLD.evidence)
    -- cancel (English seed 9.3): a prepared intent of a run the operator ended
    WHEN OLD.status = 'prepared' AND NEW.status = 'cancelled' THEN
      v_operator AND v_run IN ('cancelled', 'failed')
    ELSE false END;
  IF NOT v_ok THEN
    RAISE EXCEPTION 'operation %: % -> % is not a move of the ledger this session may make',
      OLD.operation_id, OLD.status, NEW.status USING ERRCODE = 'FC006',
      DETAIL = format('revision %s -> %s; run %s', OLD.revision, NEW.revision, v_run);
  END IF;
  IF NEW.status = 'dispatching' AND NEW.first_dispatched_at IS NULL THEN
    NEW.first_dispatched_at := clock_timestamp();
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER tool_operations_guard BEFORE INSERT OR UPDATE ON public.tool_operations
  FOR EACH ROW EXECUTE FUNCTION fencecheck.guard_ledger();

-- At COMMIT: an intent was registered in a transaction that also wrote a
-- checkpoint of its run (so, by check_run_write, a protected write).
CREATE FUNCTION fencecheck.check_intent_write() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF current_setting('is_superuser') = 'on' OR EXISTS (
       SELECT 1 FROM public.agent_checkpoints c
        WHERE c.run_id = NEW.run_id AND c.xmin = pg_current_xact_id()::xid) THEN
    RETURN NULL;
  END IF;
  RAISE EXCEPTION 'operation % was registered outside a protected write of run %',
    NEW.operation_id, NEW.run_id USING ERRCODE = 'FC006';
END
$$;
CREATE CONSTRAINT TRIGGER tool_operations_intent_check AFTER INSERT ON public.tool_operations
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fencecheck.check_intent_write();

-- The operational half (issue 15): the state table in one place, the
-- operator's decisions with an audit trail, and leaving PAUSED_INDOUBT.
--
--   fencecheck._state_table()   every (action, from, to) of a run's status;
--                               the terminal-state trigger becomes a guard
--                               that refuses any status change not in it
--   public.operator_actions     one row per operator decision: who
--                               (session_user), why, ticket, before/after,
--                               database time
--   fencecheck.operator_*       the control plane's decisions (operator group)
--   ledger_converge             a converged operation of a run paused in
--                               doubt puts the run back in the queue

-- ------------------------------------------------------------ the state table

-- The seeds' state table (Chinese seed §3.1, English seed §7), one row per
-- allowed change of agent_runs.status, named by the action that makes it.
-- Worker actions need the lease (protected writes, lease functions);
-- operator actions are the control plane's; reconcile is the automatic
-- reconciler. reference_impl/states.py mirrors it for the model test.
CREATE FUNCTION fencecheck._state_table()
RETURNS TABLE (action text, from_status text, to_status text, actor text)
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  VALUES
    ('grant',       'queued',         'running',        'worker'),
    ('start',       'running',        'running',        'worker'),
    ('checkpoint',  'running',        'running',        'worker'),
    ('checkpoint',  'waiting_tool',   'waiting_tool',   'worker'),
    ('intent',      'running',        'waiting_tool',   'worker'),
    ('intent',      'waiting_tool',   'waiting_tool',   'worker'),
    ('tool_result', 'waiting_tool',   'running',        'worker'),
    ('tool_result', 'running',        'running',        'worker'),
    ('succeed',     'running',        'succeeded',      'worker'),
    ('succeed',     'waiting_tool',   'succeeded',      'worker'),
    ('fail',        'running',        'failed',         'worker'),
    ('fail',        'waiting_tool',   'failed',         'worker'),
    ('freeze',      'running',        'paused_indoubt', 'worker'),
    ('freeze',      'waiting_tool',   'paused_indoubt', 'worker'),
    ('pause_human', 'running',        'paused_human',   'worker'),
    ('pause_human', 'waiting_tool',   'paused_human',   'worker'),
    ('requeue',     'running',        'queued',         'worker'),
    ('requeue',     'waiting_tool',   'queued',         'worker'),
    ('release',     'running',        'queued',         'worker'),
    ('release',     'waiting_tool',   'queued',         'worker'),
    ('cancel',      'queued',         'cancelled',      'operator'),
    ('cancel',      'running',        'cancelled',      'operator'),
    ('cancel',      'waiting_tool',   'cancelled',      'operator'),
    ('cancel',      'paused_indoubt', 'cancelled',      'operator'),
    ('cancel',      'paused_human',   'cancelled',      'operator'),
    ('resolve',     'paused_indoubt', 'queued',         'operator'),
    ('approve',     'paused_human',   'queued',         'operator'),
    ('supplement',  'paused_human',   'queued',         'operator'),
    ('terminate',   'paused_human',   'failed',         'operator'),
    ('terminate',   'paused_indoubt', 'failed',         'operator'),
    ('resume',      'paused_indoubt', 'queued',         'reconcile'),
    -- the budget safety net of requeue (attempts exhausted)
    ('requeue',     'running',        'failed',         'worker'),
    ('requeue',     'waiting_tool',   'failed',         'worker')
$$;

-- The target of ``p_action`` from ``p_from``, or NULL when the table has no
-- such row (the requeue safety net is never a first answer).
CREATE FUNCTION fencecheck._transition(p_action text, p_from text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT s.to_status FROM fencecheck._state_table() s
   WHERE s.action = p_action AND s.from_status = p_from
   ORDER BY s.to_status = 'failed' AND p_action = 'requeue'
   LIMIT 1
$$;

-- Every status change of agent_runs must be an edge of the state table:
-- terminal states never change, nothing leaves a pause but an operator or
-- the reconciler, nothing jumps. Replaces 002's terminal-state guard.
CREATE OR REPLACE FUNCTION fencecheck.guard_terminal() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NEW.status <> OLD.status AND NOT EXISTS (
       SELECT 1 FROM fencecheck._state_table() s
        WHERE s.from_status = OLD.status AND s.to_status = NEW.status) THEN
    RAISE EXCEPTION 'run % cannot go from % to %', OLD.run_id, OLD.status, NEW.status
      USING ERRCODE = 'FC004';
  END IF;
  RETURN NEW;
END
$$;

-- ------------------------------------------------------------ audit trail

-- One row per operator decision (Chinese seed §12): who, why, which ticket,
-- the run (and operation) before and after, at database time.
CREATE TABLE public.operator_actions (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id    uuid NOT NULL,
  run_id       uuid REFERENCES public.agent_runs (run_id) ON DELETE SET NULL,
  operation_id text,
  action       text NOT NULL,
  operator     name NOT NULL DEFAULT session_user,
  reason       text NOT NULL CHECK (reason <> ''),
  ticket       text,
  before       jsonb,
  after        jsonb,
  at           timestamptz NOT NULL DEFAULT clock_timestamp()
);
ALTER TABLE public.operator_actions OWNER TO fencecheck_owner;
ALTER TABLE public.operator_actions ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.operator_actions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON public.operator_actions
  USING (tenant_id = (SELECT fencecheck.session_tenant()))
  WITH CHECK (tenant_id = (SELECT fencecheck.session_tenant()));
REVOKE ALL ON public.operator_actions FROM PUBLIC;
GRANT SELECT ON public.operator_actions TO fencecheck_operator;
CREATE INDEX operator_actions_run_idx ON public.operator_actions (run_id, id);

-- A run (and one of its operations) as the audit row keeps it.
CREATE FUNCTION fencecheck._run_snapshot(p_run_id uuid, p_operation_id text)
RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT jsonb_build_object(
    'status', r.status, 'revision', r.revision, 'epoch', r.epoch, 'owner', r.owner,
    'attempt_count', r.attempt_count, 'max_attempts', r.max_attempts,
    'terminal_reason', r.terminal_reason,
    'operation', (SELECT jsonb_build_object('operation_id', o.operation_id, 'status', o.status,
                                            'remote_id', o.remote_id, 'revision', o.revision)
                    FROM public.tool_operations o
                   WHERE o.operation_id = p_operation_id AND o.run_id = r.run_id))
    FROM public.agent_runs r WHERE r.run_id = p_run_id
$$;

CREATE FUNCTION fencecheck._audit(p_run_id uuid, p_operation_id text, p_action text,
                                  p_reason text, p_ticket text, p_before jsonb)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_id bigint;
BEGIN
  IF p_reason IS NULL OR btrim(p_reason) = '' THEN
    RAISE EXCEPTION 'an operator action needs a reason' USING ERRCODE = '22023';
  END IF;
  INSERT INTO public.operator_actions (tenant_id, run_id, operation_id, action, reason, ticket,
                                       before, after)
  VALUES (fencecheck._tenant(), p_run_id, p_operation_id, p_action, p_reason, p_ticket,
          p_before, fencecheck._run_snapshot(p_run_id, p_operation_id))
  RETURNING id INTO v_id;
  RETURN v_id;
END
$$;

-- The run row, locked (waiting for any protected write in progress), or FC003.
CREATE FUNCTION fencecheck._lock_run(p_run_id uuid) RETURNS public.agent_runs
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r public.agent_runs%ROWTYPE;
BEGIN
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'FC003';
  END IF;
  RETURN r;
END
$$;

-- Status change of an operator decision: the state table says whether it is
-- allowed from where the run is; the lease (if any) is given up.
CREATE FUNCTION fencecheck._operator_move(p_run public.agent_runs, p_action text, p_reason text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_to text := fencecheck._transition(p_action, p_run.status);
BEGIN
  IF v_to IS NULL THEN
    RAISE EXCEPTION 'run % is %: % is not allowed', p_run.run_id, p_run.status, p_action
      USING ERRCODE = 'FC004';
  END IF;
  UPDATE public.agent_runs x
     SET status = v_to, owner = NULL, lease_expires_at = NULL,
         next_attempt_at = CASE WHEN v_to = 'queued' THEN clock_timestamp()
                                ELSE x.next_attempt_at END,
         terminal_reason = CASE WHEN v_to IN ('failed', 'cancelled') THEN p_reason
                                ELSE x.terminal_reason END,
         updated_at = clock_timestamp()
   WHERE x.run_id = p_run.run_id;
  INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
  VALUES (gen_random_uuid(), p_run.tenant_id, p_run.run_id, 'agent.' || p_action,
          jsonb_build_object('run_id', p_run.run_id, 'tenant_id', p_run.tenant_id,
                             'from', p_run.status, 'to', v_to, 'reason', p_reason,
                             'operator', session_user));
  RETURN v_to;
END
$$;

-- ------------------------------------------------------------ operator decisions

-- Cancel (English seed §9.3, rule 6): prepared operations are forbidden;
-- dispatching and unknown ones are left as they are (they may have
-- happened) and are reconciled to the remote fact afterwards; a result that
-- arrives for them is recorded on the ledger and never moves the run.
CREATE FUNCTION fencecheck.operator_cancel(p_run_id uuid, p_reason text, p_ticket text DEFAULT NULL)
RETURNS TABLE (run_status text, operations jsonb, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_before jsonb;
  v_status text;
  v_ops jsonb;
BEGIN
  PERFORM fencecheck._lock_run(p_run_id);
  v_before := fencecheck._run_snapshot(p_run_id, NULL);
  SELECT c.run_status, c.operations INTO v_status, v_ops
    FROM fencecheck.cancel_run(p_run_id, p_reason) c;
  RETURN QUERY SELECT v_status, v_ops,
    fencecheck._audit(p_run_id, NULL, 'cancel', p_reason, p_ticket, v_before);
END
$$;

-- Resolve an operation in doubt by a person's finding: ``executed`` (with
-- the remote id found) or ``not_executed``. The operation converges
-- (succeeded / failed_final with executed=false) and the run paused in
-- doubt goes back to the queue: a worker then continues from the ledger
-- (adopts the result, or plans the effect again under a new version).
CREATE FUNCTION fencecheck.operator_resolve(p_run_id uuid, p_operation_id text, p_decision text,
                                            p_remote_id text, p_reason text,
                                            p_ticket text DEFAULT NULL)
RETURNS TABLE (run_status text, operation_status text, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r public.agent_runs;
  o public.tool_operations%ROWTYPE;
  v_before jsonb;
  v_outcome text;
  v_status text;
BEGIN
  r := fencecheck._lock_run(p_run_id);
  SELECT * INTO o FROM public.tool_operations x
   WHERE x.operation_id = p_operation_id AND x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % has no operation %', p_run_id, p_operation_id USING ERRCODE = 'FC003';
  END IF;
  IF r.status <> 'paused_indoubt' OR o.status NOT IN ('unknown', 'dispatching') THEN
    RAISE EXCEPTION 'run % is %, operation % is %: nothing in doubt to resolve',
      p_run_id, r.status, p_operation_id, o.status USING ERRCODE = 'FC004';
  END IF;
  IF p_decision NOT IN ('executed', 'not_executed')
     OR (p_decision = 'executed' AND p_remote_id IS NULL) THEN
    RAISE EXCEPTION 'decision is executed (with the remote id) or not_executed'
      USING ERRCODE = '22023';
  END IF;
  v_before := fencecheck._run_snapshot(p_run_id, p_operation_id);
  v_outcome := CASE p_decision WHEN 'executed' THEN 'succeeded' ELSE 'failed_final' END;
  UPDATE public.tool_operations x
     SET status = v_outcome, remote_id = p_remote_id, dispatch_owner = NULL,
         dispatch_until = NULL,
         result = jsonb_build_object('executed', p_decision = 'executed',
                                     'resource_id', p_remote_id, 'source', 'operator'),
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'operator_resolved', 'decision', p_decision,
           'operator', session_user, 'reason', p_reason, 'ticket', p_ticket)),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id;
  v_status := fencecheck._operator_move(r, 'resolve', p_reason);
  RETURN QUERY SELECT v_status, v_outcome,
    fencecheck._audit(p_run_id, p_operation_id, 'resolve:' || p_decision, p_reason, p_ticket,
                      v_before);
END
$$;

-- A person's decision on a run paused for a human (Chinese seed §3.1, §10):
-- approve (continue as planned; a run paused because its attempt budget ran
-- out gets one more attempt), supplement (continue with the supplied fields,
-- kept in input.supplement: the next request differs, so the worker plans
-- the effect under a new effect_version), or terminate (failed). Terminate
-- also ends a run paused in doubt; its operation in doubt stays as it is.
CREATE FUNCTION fencecheck.operator_decide(p_run_id uuid, p_decision text, p_supplement jsonb,
                                           p_reason text, p_ticket text DEFAULT NULL)
RETURNS TABLE (run_status text, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r public.agent_runs;
  v_before jsonb;
  v_status text;
BEGIN
  r := fencecheck._lock_run(p_run_id);
  IF p_decision NOT IN ('approve', 'supplement', 'terminate')
     OR (p_decision = 'supplement' AND jsonb_typeof(p_supplement) IS DISTINCT FROM 'object') THEN
    RAISE EXCEPTION 'decision is approve, supplement (with an object) or terminate'
      USING ERRCODE = '22023';
  END IF;
  v_before := fencecheck._run_snapshot(p_run_id, NULL);
  v_status := fencecheck._operator_move(r, p_decision, p_reason);
  IF p_decision = 'supplement' THEN
    UPDATE public.agent_runs x
       SET input = x.input || jsonb_build_object(
             'supplement', COALESCE(x.input->'supplement', '{}'::jsonb) || p_supplement)
     WHERE x.run_id = p_run_id;
  END IF;
  IF v_status = 'queued' AND r.attempt_count >= r.max_attempts THEN
    UPDATE public.agent_runs x SET max_attempts = r.attempt_count + 1 WHERE x.run_id = p_run_id;
  END IF;
  IF v_status = 'failed' THEN
    UPDATE public.tool_operations o
       SET status = 'cancelled', revision = o.revision + 1, updated_at = clock_timestamp()
     WHERE o.run_id = p_run_id AND o.status = 'prepared';
  END IF;
  RETURN QUERY SELECT v_status,
    fencecheck._audit(p_run_id, NULL, p_decision, p_reason, p_ticket, v_before);
END
$$;

-- Manual convergence of an operation in doubt to a fact a person
-- established (e.g. from the tool's console), whatever the run's status:
-- the ledger records it, the run is not moved (use operator_resolve for a
-- run paused in doubt).
CREATE FUNCTION fencecheck.operator_converge(p_operation_id text, p_outcome text,
                                             p_remote_id text, p_reason text,
                                             p_ticket text DEFAULT NULL)
RETURNS TABLE (operation_status text, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  o public.tool_operations%ROWTYPE;
  v_before jsonb;
BEGIN
  SELECT * INTO o FROM public.tool_operations x WHERE x.operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'operation % not found', p_operation_id USING ERRCODE = 'FC003';
  END IF;
  IF o.status <> 'unknown' OR p_outcome NOT IN ('succeeded', 'failed_final') THEN
    RAISE EXCEPTION 'operation % is %: only unknown converges, to succeeded or failed_final',
      p_operation_id, o.status USING ERRCODE = 'FC004';
  END IF;
  v_before := fencecheck._run_snapshot(o.run_id, p_operation_id);
  UPDATE public.tool_operations x
     SET status = p_outcome, remote_id = p_remote_id,
         result = jsonb_build_object('executed', p_outcome = 'succeeded',
                                     'resource_id', p_remote_id, 'source', 'operator'),
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'operator_converged', 'outcome', p_outcome,
           'operator', session_user, 'reason', p_reason, 'ticket', p_ticket)),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id;
  RETURN QUERY SELECT p_outcome,
    fencecheck._audit(o.run_id, p_operation_id, 'converge', p_reason, p_ticket, v_before);
END
$$;

-- ------------------------------------------------------------ leaving PAUSED_INDOUBT

-- The automatic reconciler's convergence (query found the remote fact, or a
-- definite negative): as before, plus: when the run is paused in doubt and
-- none of its operations is in doubt any more, the run goes back to the
-- queue (English seed §9.3; Chinese seed §8.3: "confirmed executed ->
-- forward, confirmed not executed -> QUEUED"). The worker that claims it
-- continues from the ledger.
CREATE OR REPLACE FUNCTION fencecheck.ledger_converge(p_operation_id text, p_expected_revision bigint,
                                           p_outcome text, p_remote_id text, p_result jsonb,
                                           p_evidence jsonb)
RETURNS fencecheck.ledger_outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v fencecheck.ledger_outcome;
  v_run uuid;
  r public.agent_runs%ROWTYPE;
BEGIN
  IF p_outcome NOT IN ('succeeded', 'failed_final') THEN
    RAISE EXCEPTION 'outcome must be succeeded or failed_final' USING ERRCODE = '22023';
  END IF;
  UPDATE public.tool_operations x
     SET status = p_outcome, remote_id = p_remote_id, result = p_result,
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'converged', 'evidence', p_evidence)),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id AND x.status = 'unknown'
     AND x.revision = p_expected_revision
  RETURNING 'ok', x.status, x.revision, x.run_id INTO v.outcome, v.status, v.revision, v_run;
  IF NOT FOUND THEN
    SELECT 'mismatch', x.status, x.revision INTO v
      FROM public.tool_operations x WHERE x.operation_id = p_operation_id;
    v.outcome := COALESCE(v.outcome, 'missing');
    RETURN v;
  END IF;
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = v_run FOR UPDATE;
  IF r.status = 'paused_indoubt' AND NOT EXISTS (
       SELECT 1 FROM public.tool_operations o
        WHERE o.run_id = v_run AND o.status IN ('unknown', 'dispatching')) THEN
    PERFORM fencecheck._operator_move(r, 'resume', 'reconciled: ' || p_outcome);
  END IF;
  RETURN v;
END
$$;

-- ------------------------------------------------------------ effect versions

-- What the tool promised when the intent was registered: how long it keeps
-- an idempotency key (NULL: no bounded key memory, or no key at all), and
-- when the first request under the key may have left (the first dispatch
-- claim: never later than the tool's own receipt, so the window judged
-- from it ends no later than the tool's).
ALTER TABLE public.tool_operations
  ADD COLUMN retention_ms bigint CHECK (retention_ms IS NULL OR retention_ms >= 0),
  ADD COLUMN first_dispatched_at timestamptz;

CREATE FUNCTION fencecheck._ledger_first_dispatch() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NEW.status = 'dispatching' AND NEW.first_dispatched_at IS NULL THEN
    NEW.first_dispatched_at := clock_timestamp();
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER tool_operations_first_dispatch BEFORE UPDATE OF status ON public.tool_operations
  FOR EACH ROW EXECUTE FUNCTION fencecheck._ledger_first_dispatch();

-- Register an intent (as in 003), plus two rules:
-- * effect_version N > 1 of a step may be registered only when every earlier
--   version of that step is definitely without effect (failed_final with
--   executed=false, or cancelled): a changed or re-planned effect never
--   runs beside one that may have happened (English seed §9.3: "modifying a
--   planned effect increments effect_version, preserving original intent");
-- * the tool's declared key retention is stored with the intent.
CREATE OR REPLACE FUNCTION fencecheck._ledger_register_intent(p_run_id uuid, p_tenant uuid,
                                                              p_effect jsonb)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  o public.tool_operations%ROWTYPE;
  v_version integer := (p_effect->>'effect_version')::integer;
BEGIN
  IF v_version > 1 AND EXISTS (
       SELECT 1 FROM public.tool_operations x
        WHERE x.run_id = p_run_id AND x.step_id = p_effect->>'step_id'
          AND x.effect_version < v_version
          AND NOT (x.status = 'cancelled'
                   OR (x.status = 'failed_final'
                       AND COALESCE(x.result->>'executed', 'false') = 'false'))) THEN
    RAISE EXCEPTION 'step % of run %: an earlier effect version may have happened',
      p_effect->>'step_id', p_run_id USING ERRCODE = 'FC006';
  END IF;
  INSERT INTO public.tool_operations (
    operation_id, tenant_id, run_id, step_id, effect_version, tool_name, tool_capability,
    idempotency_key, request_digest, request_body, status, retention_ms)
  VALUES (
    p_effect->>'operation_id', p_tenant, p_run_id, p_effect->>'step_id', v_version,
    p_effect->>'tool_name', p_effect->>'tool_capability',
    p_effect->>'idempotency_key', p_effect->>'request_digest', p_effect->'request_body', 'prepared',
    (p_effect->>'retention_ms')::bigint)
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

-- Same-key retry of an unknown operation (as in 004), only while the tool
-- still remembers the key: the retry must reach the tool before the
-- declared retention window, counted from the first dispatch, runs out
-- (English seed §9 capability table; Chinese seed §7). Past it a repeat
-- could create a second resource: the operation is left to query or to a
-- person.
CREATE OR REPLACE FUNCTION fencecheck.ledger_claim_retry(p_dispatch_owner text, p_ttl_ms bigint,
                                              p_operation_id text, p_expected_revision bigint)
RETURNS SETOF public.tool_operations
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
  UPDATE public.tool_operations o
     SET status = 'dispatching', dispatch_owner = p_dispatch_owner,
         dispatch_until = clock_timestamp() + fencecheck._ms(p_ttl_ms),
         evidence = o.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'same_key_retry', 'dispatch_owner', p_dispatch_owner)),
         revision = o.revision + 1, updated_at = clock_timestamp()
   WHERE o.operation_id = p_operation_id AND o.status = 'unknown'
     AND o.revision = p_expected_revision
     AND o.tool_capability IN ('idempotent', 'deterministic_id')
     AND (o.tool_capability <> 'idempotent' OR o.retention_ms IS NULL
          OR o.first_dispatched_at IS NULL
          OR clock_timestamp() + fencecheck._ms(p_ttl_ms)
             < o.first_dispatched_at + o.retention_ms * interval '1 millisecond')
     AND EXISTS (SELECT 1 FROM public.agent_runs r
                  WHERE r.run_id = o.run_id AND r.status IN ('queued', 'running', 'waiting_tool'))
  RETURNING o.*;
END
$$;

-- ------------------------------------------------------------ cancel policy

-- An effect that turns out to have happened after its run was cancelled is
-- recorded on the ledger (never hidden) and announced for compensation: the
-- run stays cancelled (English seed §9.3: "define remote cancel,
-- compensation, or manual handling").
CREATE FUNCTION fencecheck._ledger_after_cancel() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NEW.status = 'succeeded' AND OLD.status <> 'succeeded' AND EXISTS (
       SELECT 1 FROM public.agent_runs r WHERE r.run_id = NEW.run_id AND r.status = 'cancelled') THEN
    INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
    VALUES (gen_random_uuid(), NEW.tenant_id, NEW.run_id, 'agent.compensation_required',
            jsonb_build_object('run_id', NEW.run_id, 'operation_id', NEW.operation_id,
                               'tool', NEW.tool_name, 'remote_id', NEW.remote_id));
  END IF;
  RETURN NULL;
END
$$;
CREATE TRIGGER tool_operations_after_cancel AFTER UPDATE OF status ON public.tool_operations
  FOR EACH ROW EXECUTE FUNCTION fencecheck._ledger_after_cancel();
ALTER FUNCTION fencecheck._ledger_after_cancel() OWNER TO fencecheck_owner;

-- ------------------------------------------------------------ retention

-- Archive-and-delete of old finished work (English seed §4, Chinese seed
-- §12): a task goes as a whole, with every run, checkpoint, ledger row and
-- outbox row, only when every run of it is terminal and untouched for the
-- window, none of its operations is prepared, dispatching or unknown (in
-- doubt is never deleted), and every outbox row was published. Returns
-- what it deleted, one JSON document per task, so the caller can keep it
-- (the CLI writes and syncs its archive before it commits). The audit
-- trail of operator decisions stays (its run_id is set to NULL). One audit
-- row records the purge itself.
CREATE FUNCTION fencecheck.operator_purge(p_older_than_ms bigint, p_limit integer,
                                          p_reason text, p_ticket text DEFAULT NULL)
RETURNS TABLE (task_id text, archived jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_tenant uuid := fencecheck._tenant();
  v_cut timestamptz := clock_timestamp() - p_older_than_ms * interval '1 millisecond';
  t record;
  v_runs uuid[];
  v_doc jsonb;
  n integer := 0;
BEGIN
  IF p_older_than_ms IS NULL OR p_older_than_ms < 0 OR p_limit IS NULL OR p_limit < 1 THEN
    RAISE EXCEPTION 'older_than_ms >= 0 and limit >= 1' USING ERRCODE = '22023';
  END IF;
  FOR t IN
    SELECT k.task_id AS id FROM public.agent_tasks k
     WHERE k.tenant_id = v_tenant
       AND NOT EXISTS (SELECT 1 FROM public.agent_runs r
                        WHERE r.tenant_id = k.tenant_id AND r.task_id = k.task_id
                          AND (r.status NOT IN ('succeeded', 'failed', 'cancelled')
                               OR r.updated_at >= v_cut))
       AND NOT EXISTS (SELECT 1 FROM public.agent_runs r
                         JOIN public.tool_operations o ON o.run_id = r.run_id
                        WHERE r.tenant_id = k.tenant_id AND r.task_id = k.task_id
                          AND o.status IN ('prepared', 'dispatching', 'unknown'))
       AND NOT EXISTS (SELECT 1 FROM public.agent_runs r
                         JOIN public.outbox x ON x.run_id = r.run_id
                        WHERE r.tenant_id = k.tenant_id AND r.task_id = k.task_id
                          AND x.published_at IS NULL)
     ORDER BY k.updated_at
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  LOOP
    SELECT array_agg(r.run_id) INTO v_runs FROM public.agent_runs r
     WHERE r.tenant_id = v_tenant AND r.task_id = t.id;
    SELECT jsonb_build_object(
             'task_id', t.id, 'tenant_id', v_tenant, 'archived_at', clock_timestamp(),
             'runs', COALESCE(jsonb_agg(jsonb_build_object(
               'run', to_jsonb(r),
               'checkpoints', (SELECT COALESCE(jsonb_agg(to_jsonb(c) ORDER BY c.revision), '[]')
                                 FROM public.agent_checkpoints c WHERE c.run_id = r.run_id),
               'operations', (SELECT COALESCE(jsonb_agg(to_jsonb(o)), '[]')
                                FROM public.tool_operations o WHERE o.run_id = r.run_id),
               'outbox', (SELECT COALESCE(jsonb_agg(to_jsonb(x) ORDER BY x.id), '[]')
                            FROM public.outbox x WHERE x.run_id = r.run_id))), '[]'))
      INTO v_doc
      FROM public.agent_runs r WHERE r.run_id = ANY (v_runs);
    UPDATE public.agent_tasks k SET active_run_id = NULL
     WHERE k.tenant_id = v_tenant AND k.task_id = t.id;
    DELETE FROM public.agent_checkpoints c WHERE c.run_id = ANY (v_runs);
    DELETE FROM public.outbox x WHERE x.run_id = ANY (v_runs);
    DELETE FROM public.tool_operations o WHERE o.run_id = ANY (v_runs);
    DELETE FROM public.agent_runs r WHERE r.run_id = ANY (v_runs);
    DELETE FROM public.agent_tasks k WHERE k.tenant_id = v_tenant AND k.task_id = t.id;
    n := n + 1;
    task_id := t.id;
    archived := v_doc;
    RETURN NEXT;
  END LOOP;
  PERFORM fencecheck._audit(NULL, NULL, 'purge', p_reason, p_ticket,
                            jsonb_build_object('tasks', n, 'older_than_ms', p_older_than_ms));
END
$$;

-- The run row locked for an operator decision made in steps (the harness
-- puts the injection point after_operator_lock between this and the
-- decision): a worker's takeover waits for the decision's transaction.
CREATE FUNCTION fencecheck.operator_lock_run(p_run_id uuid) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN (fencecheck._lock_run(p_run_id)).status;
END
$$;

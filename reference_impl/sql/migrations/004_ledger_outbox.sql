-- Dispatcher, reconciler, cancel, callbacks and the outbox relay (rules 4, 6,
-- 7, 10). None of these is the run's lease holder; none advances a run.

-- Claim one prepared operation of a live run for dispatch, with a deadline.
-- Rows other dispatchers hold are skipped.
CREATE FUNCTION fencecheck.dispatch_claim(p_dispatch_owner text, p_ttl_ms bigint,
                                          p_operation_id text DEFAULT NULL)
RETURNS SETOF public.tool_operations
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
  WITH candidate AS (
    SELECT o.operation_id
      FROM public.tool_operations o
      JOIN public.agent_runs r ON r.run_id = o.run_id
     WHERE o.status = 'prepared'
       AND r.status IN ('queued', 'running', 'waiting_tool')
       AND (p_operation_id IS NULL OR o.operation_id = p_operation_id)
     ORDER BY o.updated_at
     LIMIT 1
       FOR UPDATE OF o SKIP LOCKED
  )
  UPDATE public.tool_operations o
     SET status = 'dispatching', dispatch_owner = p_dispatch_owner,
         dispatch_until = clock_timestamp() + fencecheck._ms(p_ttl_ms),
         revision = o.revision + 1, updated_at = clock_timestamp()
    FROM candidate c
   WHERE o.operation_id = c.operation_id
  RETURNING o.*;
END
$$;

-- Record the tool's definite answer (dispatcher, not the run owner): only the
-- claim that sent the request (dispatch owner + ledger revision + digest).
CREATE FUNCTION fencecheck.record_tool_result(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint, p_request_digest text,
  p_outcome text, p_remote_id text, p_result jsonb)
RETURNS fencecheck.ledger_outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v fencecheck.ledger_outcome;
BEGIN
  IF p_outcome NOT IN ('succeeded', 'failed_final') THEN
    RAISE EXCEPTION 'outcome must be succeeded or failed_final' USING ERRCODE = '22023';
  END IF;
  UPDATE public.tool_operations x
     SET status = p_outcome, remote_id = p_remote_id, result = p_result, dispatch_until = NULL,
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id AND x.status = 'dispatching'
     AND x.dispatch_owner = p_dispatch_owner AND x.revision = p_expected_revision
     AND x.request_digest = p_request_digest
  RETURNING 'ok', x.status, x.revision INTO v;
  IF NOT FOUND THEN
    v.outcome := fencecheck._ledger_miss(p_operation_id, p_dispatch_owner, p_expected_revision,
                                         p_request_digest);
  END IF;
  RETURN v;
END
$$;

-- A timeout or lost answer on our own live claim: unknown, with evidence.
CREATE FUNCTION fencecheck.ledger_mark_unknown(p_operation_id text, p_dispatch_owner text,
                                               p_expected_revision bigint, p_error jsonb)
RETURNS fencecheck.ledger_outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v fencecheck.ledger_outcome;
BEGIN
  UPDATE public.tool_operations x
     SET status = 'unknown', dispatch_owner = NULL, dispatch_until = NULL,
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'outcome_unknown',
           'dispatch_owner', p_dispatch_owner, 'error', p_error)),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id AND x.status = 'dispatching'
     AND x.dispatch_owner = p_dispatch_owner AND x.revision = p_expected_revision
  RETURNING 'ok', x.status, x.revision INTO v;
  IF NOT FOUND THEN
    v.outcome := fencecheck._ledger_miss(p_operation_id, p_dispatch_owner, p_expected_revision, NULL);
  END IF;
  RETURN v;
END
$$;

-- The tool explicitly refused with "retry later" (HTTP 429): proof that it
-- did NOT act, so the intent may be dispatched again. Distinct from a claim
-- that expired, which only ever becomes unknown.
CREATE FUNCTION fencecheck.ledger_return_rejected(p_operation_id text, p_dispatch_owner text,
                                                  p_expected_revision bigint, p_error jsonb)
RETURNS fencecheck.ledger_outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v fencecheck.ledger_outcome;
BEGIN
  UPDATE public.tool_operations x
     SET status = 'prepared', dispatch_owner = NULL, dispatch_until = NULL,
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'rejected_retryable',
           'dispatch_owner', p_dispatch_owner, 'error', p_error)),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id AND x.status = 'dispatching'
     AND x.dispatch_owner = p_dispatch_owner AND x.revision = p_expected_revision
  RETURNING 'ok', x.status, x.revision INTO v;
  IF NOT FOUND THEN
    v.outcome := fencecheck._ledger_miss(p_operation_id, p_dispatch_owner, p_expected_revision, NULL);
  END IF;
  RETURN v;
END
$$;

-- Reconciler: every dispatch claim past its deadline becomes unknown, never
-- prepared (the remote may have acted). The update keeps the claim's owner
-- and revision in its condition, so a row re-claimed or written back in the
-- meantime is left alone.
CREATE FUNCTION fencecheck.reconcile_expire_claims(p_limit integer DEFAULT 100)
RETURNS TABLE (operation_id text, from_status text, to_status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  c record;
  v_now timestamptz := clock_timestamp();
BEGIN
  FOR c IN
    SELECT o.operation_id AS op, o.dispatch_owner AS owner, o.revision AS rev
      FROM public.tool_operations o
     WHERE o.status = 'dispatching' AND o.dispatch_until <= v_now
     ORDER BY o.dispatch_until
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  LOOP
    UPDATE public.tool_operations x
       SET status = 'unknown', dispatch_owner = NULL, dispatch_until = NULL,
           evidence = x.evidence || jsonb_build_array(jsonb_build_object(
             'at', clock_timestamp(), 'event', 'claim_expired', 'dispatch_owner', c.owner)),
           revision = x.revision + 1, updated_at = clock_timestamp()
     WHERE x.operation_id = c.op AND x.status = 'dispatching'
       AND x.dispatch_owner = c.owner AND x.revision = c.rev
       AND x.dispatch_until <= clock_timestamp();
    IF FOUND THEN
      operation_id := c.op; from_status := 'dispatching'; to_status := 'unknown';
      RETURN NEXT;
    END IF;
  END LOOP;
END
$$;

-- Converge an unknown operation to the remote fact found by query.
CREATE FUNCTION fencecheck.ledger_converge(p_operation_id text, p_expected_revision bigint,
                                           p_outcome text, p_remote_id text, p_result jsonb,
                                           p_evidence jsonb)
RETURNS fencecheck.ledger_outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v fencecheck.ledger_outcome;
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
  RETURNING 'ok', x.status, x.revision INTO v;
  IF NOT FOUND THEN
    SELECT 'mismatch', x.status, x.revision INTO v
      FROM public.tool_operations x WHERE x.operation_id = p_operation_id;
    v.outcome := COALESCE(v.outcome, 'missing');
  END IF;
  RETURN v;
END
$$;

-- Same-key retry of an unknown operation: only where the tool promises that
-- a second create with the same operation_id cannot make a second resource
-- (idempotent, or deterministic resource id), and only while the run is live.
CREATE FUNCTION fencecheck.ledger_claim_retry(p_dispatch_owner text, p_ttl_ms bigint,
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
     AND EXISTS (SELECT 1 FROM public.agent_runs r
                  WHERE r.run_id = o.run_id AND r.status IN ('queued', 'running', 'waiting_tool'))
  RETURNING o.*;
END
$$;

CREATE FUNCTION fencecheck.ledger_add_evidence(p_operation_id text, p_evidence jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.tool_operations x
     SET evidence = x.evidence || jsonb_build_array(
           jsonb_build_object('at', clock_timestamp()) || p_evidence)
   WHERE x.operation_id = p_operation_id;
  RETURN FOUND;
END
$$;

-- Cancel (control plane, rule 6): the run becomes cancelled and gives up its
-- lease; prepared operations are forbidden (cancelled); dispatching and
-- unknown ones stay exactly as they are: they may have happened.
CREATE FUNCTION fencecheck.cancel_run(p_run_id uuid, p_reason text DEFAULT 'cancelled')
RETURNS TABLE (run_status text, operations jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r public.agent_runs%ROWTYPE;
BEGIN
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'FC003';
  END IF;
  IF r.status NOT IN ('succeeded', 'failed', 'cancelled') THEN
    UPDATE public.agent_runs x
       SET status = 'cancelled', owner = NULL, lease_expires_at = NULL,
           terminal_reason = p_reason, updated_at = clock_timestamp()
     WHERE x.run_id = p_run_id;
    UPDATE public.tool_operations o
       SET status = 'cancelled', revision = o.revision + 1, updated_at = clock_timestamp()
     WHERE o.run_id = p_run_id AND o.status = 'prepared';
    INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
    VALUES (gen_random_uuid(), r.tenant_id, p_run_id, 'agent.cancelled',
            jsonb_build_object('run_id', p_run_id, 'tenant_id', r.tenant_id,
                               'reason', p_reason, 'epoch', r.epoch, 'revision', r.revision));
  END IF;
  RETURN QUERY
  SELECT x.status,
         COALESCE((SELECT jsonb_agg(jsonb_build_object('operation_id', o.operation_id,
                                                       'status', o.status) ORDER BY o.operation_id)
                     FROM public.tool_operations o WHERE o.run_id = p_run_id), '[]'::jsonb)
    FROM public.agent_runs x WHERE x.run_id = p_run_id;
END
$$;

-- A callback (rule 7) may converge only an operation of the run it names,
-- and only while that run is the task's active, live run. Anything else is
-- kept as evidence and refused: a late answer of an old run can never move a
-- newer run.
CREATE FUNCTION fencecheck.deliver_callback(p_run_id uuid, p_operation_id text, p_payload jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  o public.tool_operations%ROWTYPE;
  v_live boolean;
  v_remote text := COALESCE(p_payload->>'resource_id', p_payload->>'remote_id');
BEGIN
  SELECT * INTO o FROM public.tool_operations x WHERE x.operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  SELECT EXISTS (
    SELECT 1 FROM public.agent_runs r JOIN public.agent_tasks t
        ON t.tenant_id = r.tenant_id AND t.task_id = r.task_id
     WHERE r.run_id = p_run_id AND t.active_run_id = r.run_id
       AND r.status IN ('queued', 'running', 'waiting_tool')) INTO v_live;
  IF o.run_id <> p_run_id OR NOT v_live OR o.status NOT IN ('dispatching', 'unknown')
     OR v_remote IS NULL THEN
    UPDATE public.tool_operations x
       SET evidence = x.evidence || jsonb_build_array(jsonb_build_object(
             'at', clock_timestamp(), 'event', 'callback_refused', 'run_id', p_run_id,
             'payload', p_payload))
     WHERE x.operation_id = p_operation_id;
    RETURN false;
  END IF;
  UPDATE public.tool_operations x
     SET status = 'succeeded', remote_id = v_remote, result = p_payload,
         dispatch_until = NULL,
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'callback_accepted', 'payload', p_payload)),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id;
  RETURN true;
END
$$;

-- Outbox relay (rule 10): lock a batch of unpublished rows in the caller's
-- transaction, skipping rows another relay holds; mark them after the
-- broker acknowledged. A crash in between republishes: at-least-once.
CREATE FUNCTION fencecheck.outbox_lock_batch(p_limit integer)
RETURNS TABLE (id bigint, event_id uuid, run_id uuid, event_type text, payload jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
  SELECT o.id, o.event_id, o.run_id, o.event_type, o.payload
    FROM public.outbox o
   WHERE o.published_at IS NULL
   ORDER BY o.id
   LIMIT p_limit
     FOR UPDATE SKIP LOCKED;
END
$$;

CREATE FUNCTION fencecheck.outbox_mark_published(p_ids bigint[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  n integer;
BEGIN
  UPDATE public.outbox o SET published_at = clock_timestamp()
   WHERE o.id = ANY (p_ids) AND o.published_at IS NULL;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END
$$;

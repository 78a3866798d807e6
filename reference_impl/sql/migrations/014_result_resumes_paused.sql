-- A dispatcher's recorded answer resumes a run paused in doubt once nothing
-- of it is in doubt any more, as the reconciler's convergence (009's
-- ledger_converge) and a person's (012) do. An operation dispatching under
-- a live claim keeps its run paused while another of its operations
-- converges (W[converged_beside_live_claim]); when that dispatcher's answer
-- then came back, record_tool_result recorded it and left the run paused in
-- doubt with nothing in doubt, which nobody resumes (found by that state,
-- judged by run.every_run_can_progress_at_the_end).
-- Lock order as in ledger_converge: the operation (the UPDATE), then its run.
CREATE FUNCTION fencecheck._resume_if_settled(p_run_id uuid, p_reason text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r public.agent_runs%ROWTYPE;
BEGIN
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF r.status = 'paused_indoubt' AND NOT EXISTS (
       SELECT 1 FROM public.tool_operations o
        WHERE o.run_id = p_run_id AND o.status IN ('unknown', 'dispatching')) THEN
    PERFORM fencecheck._operator_move(r, 'resume', p_reason);
  END IF;
END
$$;
-- A helper like every other one (010's rule): owned by fencecheck_owner and
-- executable by no role (a new function is executable by PUBLIC otherwise).
ALTER FUNCTION fencecheck._resume_if_settled(uuid, text) OWNER TO fencecheck_owner;
REVOKE ALL ON FUNCTION fencecheck._resume_if_settled(uuid, text)
  FROM PUBLIC, fencecheck_worker, fencecheck_operator;

CREATE OR REPLACE FUNCTION fencecheck.record_tool_result(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint, p_request_digest text,
  p_outcome text, p_remote_id text, p_result jsonb)
RETURNS fencecheck.ledger_outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v fencecheck.ledger_outcome;
  v_run uuid;
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
  RETURNING 'ok', x.status, x.revision, x.run_id INTO v.outcome, v.status, v.revision, v_run;
  IF NOT FOUND THEN
    v.outcome := fencecheck._ledger_miss(p_operation_id, p_dispatch_owner, p_expected_revision,
                                         p_request_digest);
    RETURN v;
  END IF;
  PERFORM fencecheck._resume_if_settled(v_run, 'dispatched: ' || p_outcome);
  RETURN v;
END
$$;

-- The same for a 429 (the tool's proof it did not act): the operation goes
-- back to prepared, nothing of the run may be in doubt any more, and the run
-- must not stay paused in doubt.
CREATE OR REPLACE FUNCTION fencecheck.ledger_return_rejected(p_operation_id text,
                                                             p_dispatch_owner text,
                                                             p_expected_revision bigint,
                                                             p_error jsonb)
RETURNS fencecheck.ledger_outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v fencecheck.ledger_outcome;
  v_run uuid;
BEGIN
  UPDATE public.tool_operations x
     SET status = 'prepared', dispatch_owner = NULL, dispatch_until = NULL,
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'rejected_retryable',
           'dispatch_owner', p_dispatch_owner, 'error', p_error)),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id AND x.status = 'dispatching'
     AND x.dispatch_owner = p_dispatch_owner AND x.revision = p_expected_revision
  RETURNING 'ok', x.status, x.revision, x.run_id INTO v.outcome, v.status, v.revision, v_run;
  IF NOT FOUND THEN
    v.outcome := fencecheck._ledger_miss(p_operation_id, p_dispatch_owner, p_expected_revision, NULL);
    RETURN v;
  END IF;
  PERFORM fencecheck._resume_if_settled(v_run, 'dispatch refused, retry later');
  RETURN v;
END
$$;

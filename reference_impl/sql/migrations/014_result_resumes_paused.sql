-- A dispatcher's recorded answer resumes a run paused in doubt once nothing
-- of it is in doubt any more, as the reconciler's convergence (009's
-- ledger_converge) and a person's (012) do. An operation dispatching under
-- a live claim keeps its run paused while another of its operations
-- converges (W[converged_beside_live_claim]); when that dispatcher's answer
-- then came back, record_tool_result recorded it and left the run paused in
-- doubt with nothing in doubt, which nobody resumes (found by that state,
-- judged by run.every_run_can_progress_at_the_end).
-- Lock order as in ledger_converge: the operation (the UPDATE), then its run.
CREATE OR REPLACE FUNCTION fencecheck.record_tool_result(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint, p_request_digest text,
  p_outcome text, p_remote_id text, p_result jsonb)
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
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = v_run FOR UPDATE;
  IF r.status = 'paused_indoubt' AND NOT EXISTS (
       SELECT 1 FROM public.tool_operations o
        WHERE o.run_id = v_run AND o.status IN ('unknown', 'dispatching')) THEN
    PERFORM fencecheck._operator_move(r, 'resume', 'dispatched: ' || p_outcome);
  END IF;
  RETURN v;
END
$$;

-- A person's manual convergence resumes a run paused in doubt once nothing
-- of it is in doubt any more, as the reconciler's convergence does (009's
-- ledger_converge). Before, operator_converge left such a run paused in
-- doubt with nothing in doubt: resolve refuses it (its operation is no
-- longer unknown) and nothing else resumes it, so only a cancel or a
-- terminate could end it (found in a survivor triage of issue 24; judged by
-- run.every_run_can_progress_at_the_end, J[operator_converges]).
-- Lock order as in ledger_converge: the operation, then its run.
CREATE OR REPLACE FUNCTION fencecheck.operator_converge(p_operation_id text, p_outcome text,
                                                        p_remote_id text, p_reason text,
                                                        p_ticket text DEFAULT NULL)
RETURNS TABLE (operation_status text, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  o public.tool_operations%ROWTYPE;
  r public.agent_runs%ROWTYPE;
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
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = o.run_id FOR UPDATE;
  IF r.status = 'paused_indoubt' AND NOT EXISTS (
       SELECT 1 FROM public.tool_operations y
        WHERE y.run_id = o.run_id AND y.status IN ('unknown', 'dispatching')) THEN
    PERFORM fencecheck._operator_move(r, 'resume', 'converged by an operator: ' || p_outcome);
  END IF;
  RETURN QUERY SELECT p_outcome,
    fencecheck._audit(o.run_id, p_operation_id, 'converge', p_reason, p_ticket, v_before);
END
$$;

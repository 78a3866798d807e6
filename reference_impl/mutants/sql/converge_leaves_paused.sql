-- MUTANT converge_leaves_paused (rule 5): an operator's manual convergence
-- records the fact but leaves a run paused in doubt where it was, with
-- nothing left in doubt: resolve refuses it and nothing ever resumes it
-- (the reference's behaviour before migration 012).
CREATE OR REPLACE FUNCTION fencecheck.operator_converge(p_operation_id text, p_outcome text,
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
  -- MUTANT: a run paused in doubt is not resumed, whatever is left in doubt
  RETURN QUERY SELECT p_outcome,
    fencecheck._audit(o.run_id, p_operation_id, 'converge', p_reason, p_ticket, v_before);
END
$$;

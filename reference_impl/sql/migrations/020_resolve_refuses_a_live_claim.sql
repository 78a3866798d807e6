-- A person's finding is refused on an operation still under a live dispatch
-- claim: its request may be on its way, as converge_operation (012) already
-- says. 013 took 'dispatching' whatever its deadline, so a not_executed
-- finding on an operation whose dispatcher was about to send let the workflow
-- plan version 2 while version 1 could still reach the tool and act (blind
-- hunt 62's reader). A dispatching operation whose claim ran out is in doubt
-- and a finding may settle it, as before.
CREATE OR REPLACE FUNCTION fencecheck.operator_resolve(p_run_id uuid, p_operation_id text,
                                                       p_decision text, p_remote_id text,
                                                       p_reason text, p_ticket text DEFAULT NULL)
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
  IF o.status = 'dispatching' AND o.dispatch_until > clock_timestamp() THEN
    RAISE EXCEPTION 'operation % is dispatching under a live claim until %: its request may be '
      'on its way; a finding waits for the claim to run out', p_operation_id, o.dispatch_until
      USING ERRCODE = 'FC004';
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
  v_status := r.status;
  IF NOT EXISTS (SELECT 1 FROM public.tool_operations x
                  WHERE x.run_id = p_run_id AND x.status IN ('unknown', 'dispatching')) THEN
    v_status := fencecheck._operator_move(r, 'resolve', p_reason);
  END IF;
  RETURN QUERY SELECT v_status, v_outcome,
    fencecheck._audit(p_run_id, p_operation_id, 'resolve:' || p_decision, p_reason, p_ticket,
                      v_before);
END
$$;

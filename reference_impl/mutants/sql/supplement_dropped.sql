-- MUTANT supplement_dropped (rule 5): an operator's supplement puts the run
-- back in the queue but the supplied fields are dropped: the effect is planned
-- again with the request the tool refused, not the corrected one.
CREATE OR REPLACE FUNCTION fencecheck.operator_decide(p_run_id uuid, p_decision text, p_supplement jsonb,
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
  -- MUTANT: the supplied fields are not kept; the run continues with its old request
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

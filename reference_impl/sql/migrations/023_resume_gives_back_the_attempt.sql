-- A run paused in doubt at its last attempt goes back to the queue with one
-- more attempt (worker contract section 6, run statuses). The pause
-- interrupted that attempt, it did not end it: its doubt settled (a person's
-- finding or convergence, the reconciler's, a dispatcher's answer), 016's
-- move queued it with its budget spent, and the next grant took it past
-- that budget (run.attempts_never_exceed_the_budget; blind hunt 66's reader,
-- W[lost_not_executed] with one attempt). As a person's approve of a run
-- paused for its spent budget does (009's operator_decide), the move gives
-- the attempt it interrupted back: max_attempts = attempt_count + 1.
CREATE OR REPLACE FUNCTION fencecheck._operator_move(p_run public.agent_runs, p_action text, p_reason text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_to text := fencecheck._transition(p_action, p_run.status);
  v_reason text := p_reason;
  v_active uuid;
  v_superseded boolean := false;
BEGIN
  IF v_to IS NULL THEN
    RAISE EXCEPTION 'run % is %: % is not allowed', p_run.run_id, p_run.status, p_action
      USING ERRCODE = 'FC004';
  END IF;
  IF v_to = 'queued' THEN
    SELECT t.active_run_id INTO v_active FROM public.agent_tasks t
     WHERE t.tenant_id = p_run.tenant_id AND t.task_id = p_run.task_id FOR SHARE;
    v_superseded := v_active IS DISTINCT FROM p_run.run_id;
  END IF;
  IF v_superseded AND p_action IN ('approve', 'supplement') THEN
    RAISE EXCEPTION 'run % was superseded by run % of its task: % that run instead',
      p_run.run_id, v_active, p_action USING ERRCODE = 'FC004';
  END IF;
  IF v_superseded THEN
    v_to := 'cancelled';
    v_reason := format('superseded by run %s of its task (%s: %s)', v_active, p_action, p_reason);
  END IF;
  UPDATE public.agent_runs x
     SET status = v_to, owner = NULL, lease_expires_at = NULL,
         next_attempt_at = CASE WHEN v_to = 'queued' THEN clock_timestamp()
                                ELSE x.next_attempt_at END,
         max_attempts = CASE WHEN v_to = 'queued' AND p_run.status = 'paused_indoubt'
                              AND x.attempt_count >= x.max_attempts
                             THEN x.attempt_count + 1 ELSE x.max_attempts END,
         terminal_reason = CASE WHEN v_to IN ('failed', 'cancelled') THEN v_reason
                                ELSE x.terminal_reason END,
         updated_at = clock_timestamp()
   WHERE x.run_id = p_run.run_id;
  INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
  VALUES (gen_random_uuid(), p_run.tenant_id, p_run.run_id, 'agent.' || p_action,
          jsonb_build_object('run_id', p_run.run_id, 'tenant_id', p_run.tenant_id,
                             'from', p_run.status, 'to', v_to, 'reason', v_reason,
                             'operator', session_user));
  RETURN v_to;
END
$$;

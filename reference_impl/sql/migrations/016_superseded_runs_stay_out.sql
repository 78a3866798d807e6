-- A run a retry superseded never goes back to the queue.
-- retry_run takes a task whose active run is paused (worker contract
-- section 5) and leaves the old run as it is. 009's _operator_move queued
-- whatever the state table said, so a run paused in doubt whose task was
-- retried was queued again when its last doubt settled (the reconciler, a
-- dispatcher's answer, a person's resolve or convergence): two live runs of
-- one task, both able to act at the tool (found in a survivor triage of
-- issue 24; G[retried_paused_in_doubt], run.one_live_run_per_task).
--
-- Now a move that would queue a run that is not its task's active run ends
-- it `cancelled` instead, its reason naming the run that superseded it. Its
-- ledger stays as it is (nothing of it is in doubt, or the run would not
-- move; a prepared operation is never sent: no live run claims it). A
-- person's approve or supplement of such a run asks it to go on, which only
-- the task's active run may: refused, nothing changed.
--
-- The task's row is read FOR SHARE after the run's lock: a retry_run holds
-- it FOR UPDATE while it reads the old run, so either the retry committed
-- first (this sees its new active run) or it waits for this move (and then
-- reads the old run queued: refused as live). retry_run never locks the
-- run, so the two cannot deadlock.
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

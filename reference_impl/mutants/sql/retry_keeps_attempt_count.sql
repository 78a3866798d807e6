-- MUTANT retry_keeps_attempt_count (rule 7): a retry is a new run, but it starts
-- with the old run's attempt_count: a retry of a run that spent its attempt
-- budget starts with the budget already spent, so its first requeue pauses it
-- for a human again (issue 24's hidden bug: "a retried run that starts with the
-- old run's spent attempt count").
CREATE OR REPLACE FUNCTION fencecheck.retry_run(p_task_id text)
RETURNS TABLE (run_id uuid, task_id text, retry_of uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_task public.agent_tasks%ROWTYPE;
  v_old public.agent_runs%ROWTYPE;
  v_run uuid := gen_random_uuid();
BEGIN
  SELECT * INTO v_task FROM public.agent_tasks t WHERE t.task_id = p_task_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'task % not found', p_task_id USING ERRCODE = 'FC003';
  END IF;
  SELECT * INTO v_old FROM public.agent_runs r WHERE r.run_id = v_task.active_run_id;
  IF v_old.status IN ('queued', 'running', 'waiting_tool') THEN
    RAISE EXCEPTION 'run % of task % is still %; cancel it first', v_old.run_id, p_task_id, v_old.status
      USING ERRCODE = 'FC008';
  END IF;
  -- MUTANT: the old run's attempt count comes along
  INSERT INTO public.agent_runs (run_id, tenant_id, task_id, input, max_attempts, retry_of,
                                 attempt_count)
  VALUES (v_run, v_task.tenant_id, p_task_id, v_old.input, v_old.max_attempts, v_old.run_id,
          v_old.attempt_count);
  UPDATE public.agent_tasks t SET active_run_id = v_run, updated_at = clock_timestamp()
   WHERE t.tenant_id = v_task.tenant_id AND t.task_id = p_task_id;
  RETURN QUERY SELECT v_run, p_task_id, v_old.run_id;
END
$$;

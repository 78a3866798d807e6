-- MUTANT retry_reuses_run_id (rule 7): a retry does not get a new run_id; the
-- old run's row is reset to queued and run again, so anything still addressed
-- to the old execution (a late callback, a stale worker) reaches the retry.
-- Reusing a finished run's id is only possible without the terminal-state
-- guard, which is the database half of "a retry is a new run": it goes too.
DROP TRIGGER IF EXISTS agent_runs_terminal_guard ON public.agent_runs;
CREATE OR REPLACE FUNCTION fencecheck.retry_run(p_task_id text)
RETURNS TABLE (run_id uuid, task_id text, retry_of uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_task public.agent_tasks%ROWTYPE;
  v_old public.agent_runs%ROWTYPE;
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
  -- MUTANT: no new run; the old run_id is queued again
  UPDATE public.agent_runs r
     SET status = 'queued', owner = NULL, lease_expires_at = NULL, terminal_reason = NULL,
         attempt_count = 0, next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
   WHERE r.run_id = v_old.run_id;
  RETURN QUERY SELECT v_old.run_id, p_task_id, v_old.run_id;
END
$$;

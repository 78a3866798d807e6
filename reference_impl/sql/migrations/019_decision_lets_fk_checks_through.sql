-- A person's decision no longer deadlocks against a retry of the task.
-- 009's _lock_run took the run's row FOR UPDATE. A retry_run holding the
-- task's row inserts the new run, whose foreign key retry_of names the old
-- run: the key check takes that row FOR KEY SHARE, which FOR UPDATE blocks;
-- the decision then asked for the task's row (016's FOR SHARE) and one of
-- the two died DeadlockDetected (J[retry_races_decision]). 016 said the
-- retry never locks the run; its foreign key does.
--
-- FOR NO KEY UPDATE is the lock an UPDATE that keeps the key takes: it still
-- excludes every other writer of the row (a takeover, a renewal, another
-- decision), and lets a key check through. Either the retry commits first
-- (the decision's 016 check then sees the run superseded and ends it
-- cancelled) or the decision does (the retry reads the run queued and is
-- refused): one live run either way, and neither waits on the other.
CREATE OR REPLACE FUNCTION fencecheck._lock_run(p_run_id uuid) RETURNS public.agent_runs
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r public.agent_runs%ROWTYPE;
BEGIN
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = p_run_id FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'FC003';
  END IF;
  RETURN r;
END
$$;

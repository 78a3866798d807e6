-- A run a retry superseded never goes back to the queue (worker contract
-- section 5, retry_run and decide). RetryRun takes a task whose active run
-- is paused and leaves that run as it is; the resume of 008 queued it when
-- its last doubt settled (the reconciler, a dispatcher's answer, a person's
-- resolve or convergence): two live runs of one task, both able to act at
-- the tool (found in a survivor triage of issue 24; G[retried_paused_in_doubt]).
-- Now the protocol ends such a run cancelled instead (internal/protocol),
-- and the guard holds every session to it:
--   * no session but a superuser queues a paused run that is not its task's
--     active run;
--   * the reconciler (a worker session) may end a superseded run paused in
--     doubt, once nothing of it is in doubt: cancelled, with a reason,
--     nothing else changed. (An operator's cancel already may.)
-- The two rules go into guard_run just before its resume rule, whose text
-- must be there: a guard_run changed since 008 stops this migration rather
-- than losing a rule.
DO $migrate$
DECLARE
  v_def text := pg_get_functiondef('fencecheck.guard_run()'::regprocedure);
  v_anchor constant text :=
    E'  IF v_actor = \'worker\' AND OLD.status = \'paused_indoubt\' AND NEW.status = \'queued\'\n';
  v_rules constant text := $rules$  IF OLD.status IN ('paused_indoubt', 'paused_human') AND NEW.status = 'queued'
     AND NOT EXISTS (SELECT 1 FROM public.agent_tasks t
                      WHERE t.tenant_id = OLD.tenant_id AND t.task_id = OLD.task_id
                        AND t.active_run_id = OLD.run_id) THEN
    RAISE EXCEPTION 'run % was superseded by a retry of its task: it is never queued again',
      OLD.run_id USING ERRCODE = 'FC004';
  END IF;
  IF v_actor = 'worker' AND OLD.status = 'paused_indoubt' AND NEW.status = 'cancelled'
     AND NEW.owner IS NULL AND NEW.lease_expires_at IS NULL AND NEW.terminal_reason IS NOT NULL
     AND NEW.revision = OLD.revision AND NEW.input = OLD.input
     AND NEW.max_attempts = OLD.max_attempts AND NEW.attempt_count = OLD.attempt_count
     AND NEW.next_attempt_at IS NOT DISTINCT FROM OLD.next_attempt_at
     AND NEW.current_step IS NOT DISTINCT FROM OLD.current_step
     AND NEW.checkpoint_schema_version IS NOT DISTINCT FROM OLD.checkpoint_schema_version
     AND NOT EXISTS (SELECT 1 FROM public.tool_operations o
                      WHERE o.run_id = OLD.run_id AND o.status IN ('unknown', 'dispatching'))
     AND NOT EXISTS (SELECT 1 FROM public.agent_tasks t
                      WHERE t.tenant_id = OLD.tenant_id AND t.task_id = OLD.task_id
                        AND t.active_run_id = OLD.run_id) THEN
    RETURN NEW;  -- 013: the end of a superseded run whose last doubt settled
  END IF;
$rules$;
BEGIN
  IF position(v_anchor IN v_def) = 0 THEN
    RAISE EXCEPTION '013: guard_run no longer has 008''s resume rule; write this change anew';
  END IF;
  EXECUTE replace(v_def, v_anchor, v_rules || v_anchor);
END
$migrate$;

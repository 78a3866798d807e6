-- A run paused in doubt at its last attempt goes back to the queue with one
-- more attempt (worker contract section 6, run statuses). The pause
-- interrupted that attempt, it did not end it; a run queued with its budget
-- spent could never be granted again (run.attempts_never_exceed_the_budget),
-- and 008's guard refused the move that gives the attempt back (FC004), so a
-- person's finding on such a run failed and it stayed paused for good (blind
-- hunt 66's reader; W[lost_not_executed] with one attempt).
--
-- The protocol's moves out of paused_indoubt (OperatorMove, ResumeRun) now
-- set max_attempts = attempt_count + 1 when the budget is spent, and the
-- guard lets exactly that change through on those two moves (as it did for
-- a person's approve of a run paused for a person). The two rules are
-- rewritten in guard_run's text, which must still hold them as 008 wrote
-- them: a guard_run changed since stops this migration rather than losing
-- a rule.
DO $migrate$
DECLARE
  v_def text := pg_get_functiondef('fencecheck.guard_run()'::regprocedure);
  v_resume constant text :=
    E'     AND NEW.owner IS NULL AND v_same_work AND NEW.attempt_count = OLD.attempt_count THEN\n'
    || E'    RETURN NEW;  -- the reconciler''s resume';
  v_resume_new constant text :=
    E'     AND NEW.owner IS NULL AND NEW.attempt_count = OLD.attempt_count\n'
    || E'     AND NEW.revision = OLD.revision AND NEW.input = OLD.input\n'
    || E'     AND NEW.current_step IS NOT DISTINCT FROM OLD.current_step\n'
    || E'     AND NEW.checkpoint_schema_version IS NOT DISTINCT FROM OLD.checkpoint_schema_version\n'
    || E'     AND NEW.terminal_reason IS NOT DISTINCT FROM OLD.terminal_reason\n'
    || E'     AND (NEW.max_attempts = OLD.max_attempts\n'
    || E'          OR (OLD.attempt_count >= OLD.max_attempts AND NEW.max_attempts = OLD.attempt_count + 1)) THEN\n'
    || E'    RETURN NEW;  -- the reconciler''s resume';
  v_operator constant text :=
    E'          OR (OLD.status = ''paused_human'' AND NEW.status = ''queued'' AND NEW.max_attempts > OLD.max_attempts))';
  v_operator_new constant text :=
    E'          OR (OLD.status = ''paused_human'' AND NEW.status = ''queued'' AND NEW.max_attempts > OLD.max_attempts)\n'
    || E'          OR (OLD.status = ''paused_indoubt'' AND NEW.status = ''queued''\n'
    || E'              AND OLD.attempt_count >= OLD.max_attempts AND NEW.max_attempts = OLD.attempt_count + 1))';
BEGIN
  IF position(v_resume IN v_def) = 0 OR position(v_operator IN v_def) = 0 THEN
    RAISE EXCEPTION '015: guard_run no longer has 008''s resume and operator rules; write this change anew';
  END IF;
  EXECUTE replace(replace(v_def, v_resume, v_resume_new), v_operator, v_operator_new);
END
$migrate$;
-- The reconciler and a dispatcher's answer resume a run in a worker session
-- (ResumeRun): the column is theirs to write now, and the guard above holds
-- them to the one change.
GRANT UPDATE (max_attempts) ON public.agent_runs TO fencecheck_worker;

-- A release in the run's last attempt gives that attempt back, as 015 does
-- for a move out of a pause: the release interrupted the attempt, it did not
-- end it. The release queued the run with its budget spent, and the next
-- claim took it past that budget (run.attempts_never_exceed_the_budget;
-- blind hunt 70's reader: a SIGTERM drain or an `ops release` of a run
-- created with max_attempts 1; T's SIGTERM variants). The Release statement
-- now sets max_attempts = GREATEST(max_attempts, attempt_count + 1), and the
-- guard's release rule lets exactly that change through. The rule is
-- rewritten in guard_run's text, which must still hold it as 008 wrote it:
-- a guard_run changed since stops this migration rather than losing a rule.
DO $migrate$
DECLARE
  v_def text := pg_get_functiondef('fencecheck.guard_run()'::regprocedure);
  v_release constant text :=
    E'  IF v_actor = ''worker'' AND OLD.status = ANY (v_holding) AND v_same_work AND NEW.owner IS NULL\n'
    || E'     AND NEW.lease_expires_at IS NULL AND NEW.status = ''queued''\n'
    || E'     AND NEW.attempt_count = OLD.attempt_count THEN\n';
  v_release_new constant text :=
    E'  IF v_actor = ''worker'' AND OLD.status = ANY (v_holding) AND NEW.owner IS NULL\n'
    || E'     AND NEW.revision = OLD.revision AND NEW.input = OLD.input\n'
    || E'     AND NEW.current_step IS NOT DISTINCT FROM OLD.current_step\n'
    || E'     AND NEW.checkpoint_schema_version IS NOT DISTINCT FROM OLD.checkpoint_schema_version\n'
    || E'     AND NEW.terminal_reason IS NOT DISTINCT FROM OLD.terminal_reason\n'
    || E'     AND NEW.max_attempts = GREATEST(OLD.max_attempts, OLD.attempt_count + 1)\n'
    || E'     AND NEW.lease_expires_at IS NULL AND NEW.status = ''queued''\n'
    || E'     AND NEW.attempt_count = OLD.attempt_count THEN\n';
BEGIN
  IF position(v_release IN v_def) = 0 THEN
    RAISE EXCEPTION '016: guard_run no longer has 008''s release rule; write this change anew';
  END IF;
  EXECUTE replace(v_def, v_release, v_release_new);
END
$migrate$;

-- A release in the run's last attempt gives that attempt back, as 023's
-- move out of a pause does: the release interrupted the attempt, it did not
-- end it. 003's release queued the run with its budget spent, and the next
-- claim took it past that budget (run.attempts_never_exceed_the_budget;
-- blind hunt 70's reader: a SIGTERM drain or an `ops release` of a run
-- created with max_attempts 1; T's SIGTERM variants). Now the release sets
-- max_attempts = attempt_count + 1 when the budget is spent.
CREATE OR REPLACE FUNCTION fencecheck.release(p_run_id uuid, p_owner text, p_epoch bigint)
RETURNS TABLE (outcome text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.agent_runs r
     SET owner = NULL, lease_expires_at = NULL, status = 'queued',
         max_attempts = GREATEST(r.max_attempts, r.attempt_count + 1),
         next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id AND r.owner = p_owner AND r.epoch = p_epoch
     AND r.status IN ('running', 'waiting_tool');
  IF FOUND THEN
    RETURN QUERY SELECT 'released'::text;
  ELSE
    RETURN QUERY SELECT fencecheck._lease_miss(p_run_id, p_owner, p_epoch);
  END IF;
END
$$;

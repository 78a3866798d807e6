-- MUTANT release_by_any_session (rule 1): release checks neither owner nor
-- epoch, so any session (a stale holder after a takeover among them) gives a
-- live lease up and hands the run back to the queue under its new holder.
CREATE OR REPLACE FUNCTION fencecheck.release(p_run_id uuid, p_owner text, p_epoch bigint)
RETURNS TABLE (outcome text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.agent_runs r
     SET owner = NULL, lease_expires_at = NULL, status = 'queued',
         max_attempts = GREATEST(r.max_attempts, r.attempt_count + 1),
         next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id  -- MUTANT: no owner, no epoch
     AND r.status IN ('running', 'waiting_tool');
  IF FOUND THEN
    RETURN QUERY SELECT 'released'::text;
  ELSE
    RETURN QUERY SELECT fencecheck._lease_miss(p_run_id, p_owner, p_epoch);
  END IF;
END
$$;

-- MUTANT release_ignores_epoch (rule 1): release checks the owner but not the
-- epoch: a session passing the current holder's owner name with an old epoch
-- gives the current lease up. Only a stale holder passing the new owner
-- with its old epoch shows it.
CREATE OR REPLACE FUNCTION fencecheck.release(p_run_id uuid, p_owner text, p_epoch bigint)
RETURNS TABLE (outcome text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.agent_runs r
     SET owner = NULL, lease_expires_at = NULL, status = 'queued',
         max_attempts = GREATEST(r.max_attempts, r.attempt_count + 1),
         next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id AND r.owner = p_owner  -- MUTANT: no "AND r.epoch = p_epoch"
     AND r.status IN ('running', 'waiting_tool');
  IF FOUND THEN
    RETURN QUERY SELECT 'released'::text;
  ELSE
    RETURN QUERY SELECT fencecheck._lease_miss(p_run_id, p_owner, p_epoch);
  END IF;
END
$$;

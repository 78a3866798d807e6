-- MUTANT release_resets_epoch (rule 1): release gives the run back with its
-- epoch reset to 0, so the next grant hands out an epoch that was used before.
CREATE OR REPLACE FUNCTION fencecheck.release(p_run_id uuid, p_owner text, p_epoch bigint)
RETURNS TABLE (outcome text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.agent_runs r
     SET owner = NULL, lease_expires_at = NULL, status = 'queued',
         max_attempts = GREATEST(r.max_attempts, r.attempt_count + 1),
         epoch = 0,  -- MUTANT: the fencing token is reset
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

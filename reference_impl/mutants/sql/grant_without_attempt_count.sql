-- MUTANT grant_without_attempt_count (rule 4): claiming a queued run does not
-- count the attempt, so the attempt budget is never spent: a refusing tool is
-- retried forever instead of the run pausing for a person.
CREATE OR REPLACE FUNCTION fencecheck._grant(p_run_id uuid, p_owner text, p_ttl_ms bigint,
                                  p_prev_owner text, p_prev_expiry timestamptz,
                                  p_lock_wait_ms double precision)
RETURNS fencecheck.lease_grant
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  g fencecheck.lease_grant;
BEGIN
  UPDATE public.agent_runs r
     SET owner = p_owner,
         epoch = r.epoch + 1,
         lease_expires_at = clock_timestamp() + fencecheck._ms(p_ttl_ms),
         status = CASE WHEN r.status = 'queued' THEN 'running' ELSE r.status END,
         attempt_count = r.attempt_count,  -- MUTANT: attempts are not counted
         updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id
  RETURNING 'acquired', r.run_id, r.owner, r.epoch, r.revision, r.status, r.lease_expires_at,
            p_prev_owner,
            CASE WHEN p_prev_expiry IS NULL THEN NULL
                 ELSE (extract(epoch FROM clock_timestamp() - p_prev_expiry) * 1000)::float8 END,
            p_lock_wait_ms
    INTO g;
  RETURN g;
END
$$;

-- MUTANT lease_granted_in_seconds (rule 1): a grant reads the lease duration
-- as seconds instead of milliseconds (a unit slip at the API boundary): every
-- lease lasts a thousand times longer than the worker was configured for, so a
-- frozen holder keeps its run far past the takeover the contract promises.
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
         lease_expires_at = clock_timestamp() + fencecheck._ms(p_ttl_ms) * 1000,  -- MUTANT: the TTL read as seconds
         status = CASE WHEN r.status = 'queued' THEN 'running' ELSE r.status END,
         attempt_count = r.attempt_count + CASE WHEN r.status = 'queued' THEN 1 ELSE 0 END,
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

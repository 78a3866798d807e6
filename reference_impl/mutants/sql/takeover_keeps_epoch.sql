-- MUTANT takeover_keeps_epoch (rule 1): the first grant of a queued run
-- still counts epoch + 1, but taking over an expired lease keeps its epoch,
-- so the old and the new holder share one fencing token.
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
         -- MUTANT: + 1 only when the run was queued, not on a takeover
         epoch = r.epoch + CASE WHEN r.status = 'queued' THEN 1 ELSE 0 END,
         lease_expires_at = clock_timestamp() + fencecheck._ms(p_ttl_ms),
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

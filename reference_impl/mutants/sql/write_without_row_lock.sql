-- MUTANT write_without_row_lock (rule 2): the lease is validated from a plain
-- read (no FOR UPDATE): nothing holds the row between the check and the write,
-- so a takeover does not wait for a write already validated.
CREATE OR REPLACE FUNCTION fencecheck.lock_lease(p_run_id uuid, p_owner text, p_epoch bigint)
RETURNS TABLE (revision bigint, status text, current_step text, lock_wait_ms double precision)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  r public.agent_runs%ROWTYPE;
BEGIN
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = p_run_id;  -- MUTANT: no FOR UPDATE
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'FC003';
  END IF;
  IF r.owner IS DISTINCT FROM p_owner OR r.epoch <> p_epoch THEN
    RAISE EXCEPTION 'lease of run % lost', p_run_id USING ERRCODE = 'FC001',
      DETAIL = format('status=%s epoch=%s', r.status, r.epoch);
  END IF;
  IF r.lease_expires_at <= clock_timestamp() THEN
    RAISE EXCEPTION 'lease of run % expired', p_run_id USING ERRCODE = 'FC002',
      DETAIL = format('status=%s epoch=%s', r.status, r.epoch);
  END IF;
  RETURN QUERY SELECT r.revision, r.status, r.current_step,
                      (extract(epoch FROM clock_timestamp() - t0) * 1000)::float8;
END
$$;

-- MUTANT write_ignores_epoch (rule 2): the protected write checks expiry but
-- not owner and epoch: after a takeover the old holder's write is judged by
-- the new holder's live lease and the revision alone.
CREATE OR REPLACE FUNCTION fencecheck.lock_lease(p_run_id uuid, p_owner text, p_epoch bigint)
RETURNS TABLE (revision bigint, status text, current_step text, lock_wait_ms double precision)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  r public.agent_runs%ROWTYPE;
BEGIN
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'FC003';
  END IF;
  -- MUTANT: no owner/epoch check
  IF r.lease_expires_at <= clock_timestamp() THEN
    RAISE EXCEPTION 'lease of run % expired', p_run_id USING ERRCODE = 'FC002',
      DETAIL = format('status=%s epoch=%s', r.status, r.epoch);
  END IF;
  RETURN QUERY SELECT r.revision, r.status, r.current_step,
                      (extract(epoch FROM clock_timestamp() - t0) * 1000)::float8;
END
$$;

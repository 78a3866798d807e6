-- MUTANT write_without_lease_check (rule 2): the protected write locks the
-- lease row but validates nothing (neither owner, epoch nor expiry): only the
-- revision CAS stands between a stale worker and the run's state.
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
  -- MUTANT: no owner/epoch check, no expiry check
  RETURN QUERY SELECT r.revision, r.status, r.current_step,
                      (extract(epoch FROM clock_timestamp() - t0) * 1000)::float8;
END
$$;

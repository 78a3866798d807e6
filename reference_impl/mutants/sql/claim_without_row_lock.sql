-- MUTANT claim_without_row_lock (rule 1): claim picks its candidate without
-- locking it (no FOR UPDATE), then grants it: two claimers that read the same
-- row both grant it, the second over the first's live lease.
CREATE OR REPLACE FUNCTION fencecheck.claim(p_owner text, p_ttl_ms bigint)
RETURNS SETOF fencecheck.lease_grant
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := clock_timestamp();
  v_id uuid;
  v_prev_owner text;
  v_prev_expiry timestamptz;
BEGIN
  PERFORM fencecheck._ms(p_ttl_ms);
  SELECT r.run_id, r.owner, r.lease_expires_at INTO v_id, v_prev_owner, v_prev_expiry
    FROM public.agent_runs r
   WHERE r.status IN ('running', 'waiting_tool') AND r.lease_expires_at <= v_now
   ORDER BY r.lease_expires_at
   LIMIT 1;  -- MUTANT: no FOR UPDATE SKIP LOCKED: the row is read unlocked
  IF NOT FOUND THEN
    SELECT r.run_id INTO v_id
      FROM public.agent_runs r
     WHERE r.status = 'queued' AND r.next_attempt_at <= v_now
     ORDER BY r.next_attempt_at, r.created_at
     LIMIT 1;  -- MUTANT: no FOR UPDATE SKIP LOCKED
    IF NOT FOUND THEN
      RETURN;
    END IF;
  END IF;
  RETURN NEXT fencecheck._grant(v_id, p_owner, p_ttl_ms, v_prev_owner, v_prev_expiry, 0);
END
$$;

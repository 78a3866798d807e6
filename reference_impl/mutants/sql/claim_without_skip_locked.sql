-- MUTANT claim_without_skip_locked (rule 1): claim locks its candidate with
-- FOR UPDATE but without SKIP LOCKED, so it queues behind any session holding
-- that run's row (a protected write in progress) instead of moving on.
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
   LIMIT 1
     FOR UPDATE;  -- MUTANT: no SKIP LOCKED: waits for rows other sessions hold
  IF NOT FOUND THEN
    SELECT r.run_id INTO v_id
      FROM public.agent_runs r
     WHERE r.status = 'queued' AND r.next_attempt_at <= v_now
     ORDER BY r.next_attempt_at, r.created_at
     LIMIT 1
       FOR UPDATE;  -- MUTANT: no SKIP LOCKED
    IF NOT FOUND THEN
      RETURN;
    END IF;
  END IF;
  RETURN NEXT fencecheck._grant(v_id, p_owner, p_ttl_ms, v_prev_owner, v_prev_expiry, 0);
END
$$;

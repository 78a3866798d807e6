-- MUTANT renew_ignores_expiry (rule 1): renew checks owner and epoch but not
-- expiry, so a lease that expired with nobody taking over yet is revived.
CREATE OR REPLACE FUNCTION fencecheck.renew(p_run_id uuid, p_owner text, p_epoch bigint, p_ttl_ms bigint)
RETURNS TABLE (outcome text, lease_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_exp timestamptz;
BEGIN
  UPDATE public.agent_runs r
     SET lease_expires_at = clock_timestamp() + fencecheck._ms(p_ttl_ms),
         updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id AND r.owner = p_owner AND r.epoch = p_epoch
     -- MUTANT: no "AND r.lease_expires_at > clock_timestamp()"
     AND r.status IN ('running', 'waiting_tool')
  RETURNING r.lease_expires_at INTO v_exp;
  IF FOUND THEN
    RETURN QUERY SELECT 'renewed'::text, v_exp;
  ELSE
    RETURN QUERY SELECT fencecheck._lease_miss(p_run_id, p_owner, p_epoch), NULL::timestamptz;
  END IF;
END
$$;

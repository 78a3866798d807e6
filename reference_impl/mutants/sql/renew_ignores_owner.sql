-- MUTANT renew_ignores_owner (rule 1): renew checks the epoch and the expiry
-- but not the owner: a stale session that learnt the new epoch (from a log,
-- an event, its own retry) renews the new holder's lease as if it were its
-- own. Only a stale holder passing the new epoch with its old owner shows it.
CREATE OR REPLACE FUNCTION fencecheck.renew(p_run_id uuid, p_owner text, p_epoch bigint, p_ttl_ms bigint)
RETURNS TABLE (outcome text, lease_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_exp timestamptz;
BEGIN
  UPDATE public.agent_runs r
     SET lease_expires_at = clock_timestamp() + fencecheck._ms(p_ttl_ms),
         updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id AND r.epoch = p_epoch  -- MUTANT: no "AND r.owner = p_owner"
     AND r.lease_expires_at > clock_timestamp()
     AND r.status IN ('running', 'waiting_tool')
  RETURNING r.lease_expires_at INTO v_exp;
  IF FOUND THEN
    RETURN QUERY SELECT 'renewed'::text, v_exp;
  ELSE
    RETURN QUERY SELECT fencecheck._lease_miss(p_run_id, p_owner, p_epoch), NULL::timestamptz;
  END IF;
END
$$;

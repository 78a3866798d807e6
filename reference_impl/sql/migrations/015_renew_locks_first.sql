-- A renewal judges the lease's expiry only once it holds the run's row.
-- 003's renew was one UPDATE whose WHERE tested the expiry: PostgreSQL
-- evaluates that test before waiting for a row another session holds, and
-- judges it again after the wait only when that session changed the row.
-- A session that merely locked it (SELECT ... FOR UPDATE, lock_lease before a
-- write, a person's decision that changed nothing) let the waiting renewal go
-- on with its test from before the wait, and a lease that ran out meanwhile
-- was revived (found by blind hunt 20 beside its planted bugs; K[renew_waited]
-- holds a renewal on the row past the lease's end).
CREATE OR REPLACE FUNCTION fencecheck.renew(p_run_id uuid, p_owner text, p_epoch bigint, p_ttl_ms bigint)
RETURNS TABLE (outcome text, lease_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_exp timestamptz;
BEGIN
  PERFORM 1 FROM public.agent_runs r WHERE r.run_id = p_run_id FOR UPDATE;
  UPDATE public.agent_runs r
     SET lease_expires_at = clock_timestamp() + fencecheck._ms(p_ttl_ms),
         updated_at = clock_timestamp()
   WHERE r.run_id = p_run_id AND r.owner = p_owner AND r.epoch = p_epoch
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

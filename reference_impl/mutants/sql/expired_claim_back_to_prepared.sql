-- MUTANT expired_claim_back_to_prepared (rule 4): a dispatch claim past its
-- deadline is put back to 'prepared' (as if the tool had not acted), so it is
-- dispatched again, although the remote may already have acted.
CREATE OR REPLACE FUNCTION fencecheck.reconcile_expire_claims(p_limit integer DEFAULT 100)
RETURNS TABLE (operation_id text, from_status text, to_status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  c record;
  v_now timestamptz := clock_timestamp();
BEGIN
  FOR c IN
    SELECT o.operation_id AS op, o.dispatch_owner AS owner, o.revision AS rev
      FROM public.tool_operations o
     WHERE o.status = 'dispatching' AND o.dispatch_until <= v_now
     ORDER BY o.dispatch_until
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  LOOP
    UPDATE public.tool_operations x
       SET status = 'prepared', dispatch_owner = NULL, dispatch_until = NULL,  -- MUTANT: was 'unknown'
           evidence = x.evidence || jsonb_build_array(jsonb_build_object(
             'at', clock_timestamp(), 'event', 'claim_expired', 'dispatch_owner', c.owner)),
           revision = x.revision + 1, updated_at = clock_timestamp()
     WHERE x.operation_id = c.op AND x.status = 'dispatching'
       AND x.dispatch_owner = c.owner AND x.revision = c.rev
       AND x.dispatch_until <= clock_timestamp();
    IF FOUND THEN
      operation_id := c.op; from_status := 'dispatching'; to_status := 'prepared';
      RETURN NEXT;
    END IF;
  END LOOP;
END
$$;

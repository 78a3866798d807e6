-- MUTANT retry_ignores_retention (rule 4): a same-key retry of an unknown
-- operation is claimed whatever the tool's declared idempotency retention:
-- past the window the tool has forgotten the key and makes a second resource.
CREATE OR REPLACE FUNCTION fencecheck.ledger_claim_retry(p_dispatch_owner text, p_ttl_ms bigint,
                                              p_operation_id text, p_expected_revision bigint)
RETURNS SETOF public.tool_operations
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
  UPDATE public.tool_operations o
     SET status = 'dispatching', dispatch_owner = p_dispatch_owner,
         dispatch_until = clock_timestamp() + fencecheck._ms(p_ttl_ms),
         evidence = o.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'same_key_retry', 'dispatch_owner', p_dispatch_owner)),
         revision = o.revision + 1, updated_at = clock_timestamp()
   WHERE o.operation_id = p_operation_id AND o.status = 'unknown'
     AND o.revision = p_expected_revision
     AND o.tool_capability IN ('idempotent', 'deterministic_id')
     -- MUTANT: the tool's retention window is not checked
     AND EXISTS (SELECT 1 FROM public.agent_runs r
                  WHERE r.run_id = o.run_id AND r.status IN ('queued', 'running', 'waiting_tool'))
  RETURNING o.*;
END
$$;

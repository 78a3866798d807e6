-- MUTANT result_ignores_dispatch_claim (rule 4): a dispatcher's tool result is
-- recorded whenever the operation is dispatching, whoever holds the claim and
-- whatever its ledger revision: a stale dispatcher's late answer overwrites a
-- newer claim that is still in flight.
CREATE OR REPLACE FUNCTION fencecheck.record_tool_result(
  p_operation_id text, p_dispatch_owner text, p_expected_revision bigint, p_request_digest text,
  p_outcome text, p_remote_id text, p_result jsonb)
RETURNS fencecheck.ledger_outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v fencecheck.ledger_outcome;
BEGIN
  IF p_outcome NOT IN ('succeeded', 'failed_final') THEN
    RAISE EXCEPTION 'outcome must be succeeded or failed_final' USING ERRCODE = '22023';
  END IF;
  UPDATE public.tool_operations x
     SET status = p_outcome, remote_id = p_remote_id, result = p_result, dispatch_until = NULL,
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id AND x.status = 'dispatching'
     -- MUTANT: no "AND x.dispatch_owner = p_dispatch_owner AND x.revision = p_expected_revision"
     AND x.request_digest = p_request_digest
  RETURNING 'ok', x.status, x.revision INTO v;
  IF NOT FOUND THEN
    v.outcome := fencecheck._ledger_miss(p_operation_id, p_dispatch_owner, p_expected_revision,
                                         p_request_digest);
  END IF;
  RETURN v;
END
$$;

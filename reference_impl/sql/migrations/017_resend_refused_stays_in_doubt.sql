-- A 429 to a same-key resend leaves the operation in doubt.
-- 014's ledger_return_rejected put every refused claim back to prepared. A
-- 429 proves only that the refused request did nothing; a same-key resend
-- repeats a request that left the operation unknown, which may still be on
-- the network and act. Back in prepared, the operation's next dispatch is a
-- new claim judged by no key retention (ledger_claim_retry's window), so
-- past the tool's retention it could make a second resource; and the run
-- was queued as if nothing were in doubt (found by W[resend_refused];
-- effect.never_prepared_again_once_in_doubt). Now such a claim goes back to
-- unknown, with the refusal in its evidence, and the run is not resumed.
CREATE OR REPLACE FUNCTION fencecheck.ledger_return_rejected(p_operation_id text,
                                                             p_dispatch_owner text,
                                                             p_expected_revision bigint,
                                                             p_error jsonb)
RETURNS fencecheck.ledger_outcome
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v fencecheck.ledger_outcome;
  v_run uuid;
BEGIN
  UPDATE public.tool_operations x
     SET status = CASE WHEN x.evidence @> '[{"event": "same_key_retry"}]' THEN 'unknown'
                       ELSE 'prepared' END,
         dispatch_owner = NULL, dispatch_until = NULL,
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'rejected_retryable',
           'dispatch_owner', p_dispatch_owner, 'error', p_error)),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id AND x.status = 'dispatching'
     AND x.dispatch_owner = p_dispatch_owner AND x.revision = p_expected_revision
  RETURNING 'ok', x.status, x.revision, x.run_id INTO v.outcome, v.status, v.revision, v_run;
  IF NOT FOUND THEN
    v.outcome := fencecheck._ledger_miss(p_operation_id, p_dispatch_owner, p_expected_revision, NULL);
    RETURN v;
  END IF;
  IF v.status = 'prepared' THEN
    PERFORM fencecheck._resume_if_settled(v_run, 'dispatch refused, retry later');
  END IF;
  RETURN v;
END
$$;

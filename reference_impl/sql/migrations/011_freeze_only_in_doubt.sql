-- A run is frozen in doubt only while its operation is in doubt (issue 24,
-- found by explore: X-s0200). The workflow reads the ledger (unknown), learns
-- nothing by query, and writes the freeze; a callback (or a reconciler, or an
-- operator) that converged the operation in between left the run paused in
-- doubt with nothing in doubt, and nothing ever resumes such a run. Freeze's
-- ledger half now locks the operation and refuses (FC007, LedgerConflict: the
-- whole protected write rolls back) unless it is still unknown or dispatching;
-- the worker reads the ledger again and continues from what it says.
CREATE OR REPLACE FUNCTION fencecheck._ledger_freeze(p_run_id uuid, p_effect jsonb)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_status text;
BEGIN
  IF p_effect IS NULL OR p_effect->>'operation_id' IS NULL THEN
    RETURN NULL;
  END IF;
  SELECT x.status INTO v_status FROM public.tool_operations x
   WHERE x.operation_id = p_effect->>'operation_id' AND x.run_id = p_run_id FOR UPDATE;
  IF FOUND AND v_status NOT IN ('unknown', 'dispatching') THEN
    RAISE EXCEPTION 'operation % is % (converged meanwhile): nothing in doubt to freeze',
      p_effect->>'operation_id', v_status USING ERRCODE = 'FC007';
  END IF;
  UPDATE public.tool_operations x
     SET status = CASE WHEN x.status = 'dispatching'
                        AND x.dispatch_owner = p_effect->>'dispatch_owner'
                        AND x.revision = (p_effect->>'ledger_revision')::bigint
                       THEN 'unknown' ELSE x.status END,
         dispatch_owner = CASE WHEN x.status = 'dispatching'
                        AND x.dispatch_owner = p_effect->>'dispatch_owner'
                        AND x.revision = (p_effect->>'ledger_revision')::bigint
                       THEN NULL ELSE x.dispatch_owner END,
         dispatch_until = CASE WHEN x.status = 'dispatching'
                        AND x.dispatch_owner = p_effect->>'dispatch_owner'
                        AND x.revision = (p_effect->>'ledger_revision')::bigint
                       THEN NULL ELSE x.dispatch_until END,
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
                      'at', clock_timestamp(), 'event', 'run_frozen', 'error', p_effect->'error')),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_effect->>'operation_id' AND x.run_id = p_run_id
  RETURNING x.status INTO v_status;
  RETURN v_status;
END
$$;

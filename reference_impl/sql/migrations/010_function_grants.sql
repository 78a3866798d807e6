-- Who may EXECUTE what (worker contract v2, section "Roles and grants").
-- Every fencecheck.* function is owned by fencecheck_owner and executable
-- by nobody but the roles named here: functions are executable by PUBLIC
-- by default, so every grant is revoked first. The two lists ARE the
-- contract: the worker group may execute exactly the worker API, the
-- operator group exactly the control-plane API; a function in neither list
-- (the "_" helpers, triggers) is the owner's alone. Experiment N reads the
-- grants from the catalog and holds them to these lists.
--
-- Idempotent: migrate runs this file after the migrations and before a
-- mutant's overlays (CREATE OR REPLACE keeps a function's owner and grants,
-- so an overlay changes exactly what it says, grants included).
DO $$
DECLARE
  f record;
  -- Leases, protected writes, the run's own ledger path (dispatch, results,
  -- automatic reconciliation), the outbox relay.
  worker_api constant text[] := ARRAY[
    'session_tenant', 'claim', 'takeover', 'renew', 'release',
    'lock_lease', 'protected_write', 'protected_write_fast',
    'dispatch_claim', 'record_tool_result', 'ledger_mark_unknown', 'ledger_return_rejected',
    'reconcile_expire_claims', 'ledger_converge', 'ledger_claim_retry', 'ledger_add_evidence',
    'outbox_lock_batch', 'outbox_mark_published'];
  -- Runs and their lifecycle outside a lease, callbacks, the automatic
  -- reconciler, and every operator decision (each writes an audit row).
  operator_api constant text[] := ARRAY[
    'session_tenant', 'create_run', 'retry_run', 'deliver_callback',
    'operator_cancel', 'operator_resolve', 'operator_decide', 'operator_converge',
    'operator_purge', 'operator_lock_run',
    'record_tool_result', 'ledger_mark_unknown', 'ledger_return_rejected',
    'reconcile_expire_claims', 'ledger_converge', 'ledger_claim_retry', 'ledger_add_evidence'];
BEGIN
  FOR f IN
    SELECT p.oid::regprocedure AS sig, p.proname AS name
      FROM pg_catalog.pg_proc p
     WHERE p.pronamespace = 'fencecheck'::regnamespace
  LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO fencecheck_owner', f.sig);
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC, fencecheck_worker, fencecheck_operator',
                   f.sig);
    IF f.name = ANY (worker_api) THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO fencecheck_worker', f.sig);
    END IF;
    IF f.name = ANY (operator_api) THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO fencecheck_operator', f.sig);
    END IF;
  END LOOP;
END
$$;
ALTER TYPE fencecheck.lease_grant OWNER TO fencecheck_owner;
ALTER TYPE fencecheck.ledger_outcome OWNER TO fencecheck_owner;
GRANT USAGE ON SCHEMA fencecheck TO fencecheck_operator;

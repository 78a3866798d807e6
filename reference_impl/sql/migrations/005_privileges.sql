-- Ownership and execute rights. Functions are executable by PUBLIC by
-- default: revoke that, then grant the public API (names without a leading
-- underscore) to the worker role only. Internal helpers stay owner-only.
DO $$
DECLARE
  f record;
BEGIN
  FOR f IN
    SELECT p.oid::regprocedure AS sig, p.proname AS name
      FROM pg_catalog.pg_proc p
     WHERE p.pronamespace = 'fencecheck'::regnamespace
  LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO fencecheck_owner', f.sig);
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.sig);
    IF left(f.name, 1) <> '_' AND f.name <> 'guard_terminal' THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO fencecheck_worker', f.sig);
    END IF;
  END LOOP;
END
$$;
ALTER TYPE fencecheck.lease_grant OWNER TO fencecheck_owner;
ALTER TYPE fencecheck.ledger_outcome OWNER TO fencecheck_owner;

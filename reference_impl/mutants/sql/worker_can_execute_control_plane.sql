-- MUTANT worker_can_execute_control_plane (rule 12): the worker group may
-- execute the control plane's functions (create, retry, cancel, callbacks,
-- operator decisions): a worker can cancel or resolve runs itself.
DO $$
DECLARE
  f record;
BEGIN
  FOR f IN
    SELECT p.oid::regprocedure AS sig FROM pg_catalog.pg_proc p
     WHERE p.pronamespace = 'fencecheck'::regnamespace
       AND (p.proname IN ('create_run', 'retry_run', 'deliver_callback')
            OR p.proname LIKE 'operator\_%')
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO fencecheck_worker', f.sig);
  END LOOP;
END
$$;

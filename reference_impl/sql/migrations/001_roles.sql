-- Roles are cluster-global while migrations run per database, and several
-- databases of one cluster may migrate at the same moment: create each role
-- only when missing, and treat losing the creation race (duplicate_object,
-- or unique_violation on pg_authid) as success.
--
-- fencecheck_owner  NOLOGIN: owns every table and every SECURITY DEFINER
--                   function; the only role the protected-write path runs as.
-- fencecheck_worker LOGIN:   what workers connect as; may read (tenant-scoped
--                   by RLS) and call the fencecheck.* API, never write the
--                   protected tables directly.
DO $$
DECLARE
  spec text[];
BEGIN
  FOREACH spec SLICE 1 IN ARRAY ARRAY[
    ARRAY['fencecheck_owner', 'NOLOGIN'],
    ARRAY['fencecheck_worker', 'LOGIN']
  ] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = spec[1]) THEN
      BEGIN
        EXECUTE format('CREATE ROLE %I %s NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS',
                       spec[1], spec[2]);
      EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- another database's migration created it first
      END;
    END IF;
  END LOOP;
END
$$;

-- Roles are cluster-wide while migrations run per database, and several
-- databases of one cluster may migrate at once: create a role only when it
-- is missing and take losing the creation race (duplicate_object, or
-- unique_violation on pg_authid) as success. The names are the contract's,
-- shared with the Python reference worker, which creates them the same way.
--
-- fencecheck_owner  NOLOGIN: owns every table and function of this schema.
-- fencecheck_worker LOGIN:   what workers connect as (worker contract,
--                   FENCECHECK_DSN); its rights are 005_grants.sql.
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

-- Worker contract v2, section 7: a session's tenant is bound to its LOGIN
-- role, never to anything the session can set.
--
-- Until 005 every policy compared tenant_id with the setting app.tenant_id,
-- which any session may set itself (set_config, SET, PGOPTIONS). From here
-- on a session's tenant is the row of public.tenant_bindings whose
-- role_name is session_user: a non-superuser cannot change session_user
-- (SET ROLE changes current_user only; SET SESSION AUTHORIZATION needs a
-- superuser), so no session can move itself to another tenant. A login
-- role without a binding sees and writes nothing.
--
-- Roles (cluster-wide; created as in 001, tolerating concurrent migrations
-- of other databases of the cluster):
--   fencecheck_worker   NOLOGIN group (001 made it LOGIN): what a worker may do
--   fencecheck_operator NOLOGIN group: the control plane (create, retry,
--                       cancel, callbacks, operator decisions)
-- Whoever deploys creates one LOGIN role per deployment and tenant, IN ROLE
-- one of the two groups, and binds it here as superuser.

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'fencecheck_operator') THEN
    BEGIN
      CREATE ROLE fencecheck_operator NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL;  -- another database's migration created it first
    END;
  END IF;
  IF (SELECT rolcanlogin FROM pg_catalog.pg_roles WHERE rolname = 'fencecheck_worker') THEN
    BEGIN
      ALTER ROLE fencecheck_worker NOLOGIN;
    EXCEPTION WHEN internal_error THEN
      -- "tuple concurrently updated": another migration altered it at the same moment.
      IF (SELECT rolcanlogin FROM pg_catalog.pg_roles WHERE rolname = 'fencecheck_worker') THEN
        RAISE;
      END IF;
    END;
  END IF;
END
$$;

-- Written only by the superuser who deploys; a session reads its own row
-- only (FORCE: also the owner), and only through session_tenant().
CREATE TABLE public.tenant_bindings (
  role_name name PRIMARY KEY,
  tenant_id uuid NOT NULL,
  bound_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
REVOKE ALL ON public.tenant_bindings FROM PUBLIC;
ALTER TABLE public.tenant_bindings ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.tenant_bindings FORCE ROW LEVEL SECURITY;
CREATE POLICY own_binding ON public.tenant_bindings FOR SELECT USING (role_name = session_user);
GRANT SELECT ON public.tenant_bindings TO fencecheck_owner;

-- The one place a session's tenant comes from: SECURITY DEFINER (its owner
-- may read the bindings, the caller may not), search_path pinned, no
-- argument, no setting, no current_user: only session_user.
CREATE OR REPLACE FUNCTION fencecheck.session_tenant() RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT b.tenant_id FROM public.tenant_bindings b WHERE b.role_name = session_user $$;
ALTER FUNCTION fencecheck.session_tenant() OWNER TO fencecheck_owner;

-- Every tenant table: row level security forced (the owner too), the same
-- policy name keyed on the binding. The sub-select makes the planner call
-- the function once per statement (an InitPlan), not once per row.
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['tenants', 'agent_tasks', 'agent_runs', 'agent_checkpoints',
                           'tool_operations', 'outbox', 'consumed_events', 'consumer_effects'] LOOP
    EXECUTE format('ALTER TABLE public.%I FORCE ROW LEVEL SECURITY', t);
    EXECUTE format('DROP POLICY tenant_isolation ON public.%I', t);
    EXECUTE format(
      'CREATE POLICY tenant_isolation ON public.%I
         USING (tenant_id = (SELECT fencecheck.session_tenant()))
         WITH CHECK (tenant_id = (SELECT fencecheck.session_tenant()))', t);
  END LOOP;
END
$$;

-- Worker contract v2: a session's tenant is bound to its LOGIN role.
--
-- Until 007 every policy compared tenant_id with the setting app.tenant_id,
-- which any session may set itself (set_config, SET, PGOPTIONS): any worker
-- session could switch tenants. From here on the tenant of a session is the
-- row of public.tenant_bindings whose role_name is session_user. A
-- non-superuser cannot change session_user (SET ROLE changes current_user
-- only; SET SESSION AUTHORIZATION needs superuser) and no setting is
-- trusted, so a session cannot switch tenants. A login role without a
-- binding sees and writes nothing.
--
-- Roles (cluster-wide, created idempotently as in 001; concurrent migrations
-- of other databases of the cluster may race us):
--   fencecheck_worker   NOLOGIN group: what a worker may do (v1 made it LOGIN)
--   fencecheck_operator NOLOGIN group: the control plane (create runs, retry,
--                       cancel, callbacks, in-doubt resolution, human
--                       decisions, manual convergence, retention)
-- Whoever deploys creates one LOGIN role per worker deployment and tenant,
-- IN ROLE one of the two groups, and binds it here as superuser.

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

-- Written only by the superuser who deploys (it owns the table); read only
-- through fencecheck.session_tenant(), and even then a session reads its own
-- row only (the policy below also holds for fencecheck_owner: FORCE).
CREATE TABLE public.tenant_bindings (
  role_name name PRIMARY KEY,
  tenant_id uuid NOT NULL,
  bound_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
REVOKE ALL ON public.tenant_bindings FROM PUBLIC;
GRANT SELECT ON public.tenant_bindings TO fencecheck_owner;
ALTER TABLE public.tenant_bindings ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.tenant_bindings FORCE ROW LEVEL SECURITY;
CREATE POLICY own_binding ON public.tenant_bindings FOR SELECT
  USING (role_name = session_user);

-- The one place a session's tenant comes from. SECURITY DEFINER (its owner
-- may read the bindings, the caller may not), search_path pinned, and no
-- argument and no setting consulted: only session_user.
CREATE FUNCTION fencecheck.session_tenant() RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT b.tenant_id FROM public.tenant_bindings b WHERE b.role_name = session_user
$$;
ALTER FUNCTION fencecheck.session_tenant() OWNER TO fencecheck_owner;

-- The API's own tenant (create_run): the binding, or FC011.
CREATE OR REPLACE FUNCTION fencecheck._tenant() RETURNS uuid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v uuid := fencecheck.session_tenant();
BEGIN
  IF v IS NULL THEN
    RAISE EXCEPTION 'login role % has no tenant binding', session_user USING ERRCODE = 'FC011';
  END IF;
  RETURN v;
END
$$;

-- Every tenant table: the same policy name, now keyed on the binding. The
-- sub-select makes the planner evaluate the function once per statement
-- (an InitPlan), not once per row.
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['tenants', 'agent_tasks', 'agent_runs', 'agent_checkpoints',
                           'tool_operations', 'outbox', 'consumed_events', 'consumer_effects'] LOOP
    EXECUTE format('DROP POLICY tenant_isolation ON public.%I', t);
    EXECUTE format(
      'CREATE POLICY tenant_isolation ON public.%I
         USING (tenant_id = (SELECT fencecheck.session_tenant()))
         WITH CHECK (tenant_id = (SELECT fencecheck.session_tenant()))', t);
  END LOOP;
END
$$;

-- The consumer's rows take the session's tenant by default.
ALTER TABLE public.consumed_events ALTER COLUMN tenant_id SET DEFAULT fencecheck.session_tenant();
ALTER TABLE public.consumer_effects ALTER COLUMN tenant_id SET DEFAULT fencecheck.session_tenant();

-- The control plane reads its tenant's rows (listing runs in doubt, their
-- ledger and evidence) and, like the worker, writes only through functions.
GRANT SELECT ON public.tenants, public.agent_tasks, public.agent_runs, public.agent_checkpoints,
  public.tool_operations, public.outbox TO fencecheck_operator;

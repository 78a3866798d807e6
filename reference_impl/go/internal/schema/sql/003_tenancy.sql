-- Tenant isolation (Chinese seed section 12; rule 12). Every tenant check of
-- every policy goes through fencecheck.session_tenant(): the one definition
-- to replace when the contract binds the tenant to the login role (v2: look
-- session_user up in public.tenant_bindings) instead of the GUC
-- app.tenant_id it reads today. Unset or empty matches nothing (fail closed).
--
-- LANGUAGE sql, STABLE, no SET clause: PostgreSQL can inline it into each
-- policy, so a per-row check costs no function call. Every name is
-- schema-qualified, so a caller's search_path cannot redirect it.
CREATE FUNCTION fencecheck.session_tenant() RETURNS uuid
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT CAST(NULLIF(pg_catalog.current_setting('app.tenant_id', true), '') AS pg_catalog.uuid) $$;

ALTER TABLE public.consumed_events ALTER COLUMN tenant_id SET DEFAULT fencecheck.session_tenant();
ALTER TABLE public.consumer_effects ALTER COLUMN tenant_id SET DEFAULT fencecheck.session_tenant();

DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['tenants', 'agent_tasks', 'agent_runs', 'agent_checkpoints',
                           'tool_operations', 'outbox', 'consumed_events', 'consumer_effects'] LOOP
    EXECUTE format('ALTER TABLE public.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format(
      'CREATE POLICY tenant_isolation ON public.%I
         USING (tenant_id = fencecheck.session_tenant())
         WITH CHECK (tenant_id = fencecheck.session_tenant())', t);
  END LOOP;
END
$$;

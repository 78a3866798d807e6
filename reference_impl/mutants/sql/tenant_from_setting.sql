-- MUTANT tenant_from_setting (rule 12): the session's tenant is taken from
-- the setting app.tenant_id when one is set, and from the login role's
-- binding only otherwise (contract v1's trust in a setting): any session
-- can switch tenants with set_config.
CREATE OR REPLACE FUNCTION fencecheck.session_tenant() RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT COALESCE(
    NULLIF(current_setting('app.tenant_id', true), '')::uuid,  -- MUTANT: a setting is trusted
    (SELECT b.tenant_id FROM public.tenant_bindings b WHERE b.role_name = session_user))
$$;

-- The tenant is judged before the protocol (worker contract section 7: a
-- cross-tenant write is refused with SQLSTATE 42501, like a row level
-- security violation).
--
-- Row level security checks a new row's WITH CHECK only after the BEFORE
-- triggers have run, so with 008's guards a row of another tenant was
-- refused for breaking the protocol (FC006/FC012), which says nothing about
-- the tenant: a well-formed row of another tenant would have reached the
-- policy only by luck of ordering. This trigger runs first on every tenant
-- table (BEFORE triggers fire in name order; "a0_" sorts before the guards)
-- and refuses a row whose tenant is not the session's own, for every
-- session that is not a superuser, so the refusal names the tenant.
CREATE FUNCTION fencecheck.guard_tenant() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF current_setting('is_superuser') = 'on' THEN
    RETURN NEW;
  END IF;
  IF NEW.tenant_id IS DISTINCT FROM (SELECT fencecheck.session_tenant()) THEN
    RAISE EXCEPTION 'new row violates the tenant binding of % for table %', session_user, TG_TABLE_NAME
      USING ERRCODE = '42501';
  END IF;
  RETURN NEW;
END
$$;
ALTER FUNCTION fencecheck.guard_tenant() OWNER TO fencecheck_owner;
REVOKE ALL ON FUNCTION fencecheck.guard_tenant() FROM PUBLIC, fencecheck_worker, fencecheck_operator;

DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['tenants', 'agent_tasks', 'agent_runs', 'agent_checkpoints',
                           'tool_operations', 'outbox', 'consumed_events', 'consumer_effects',
                           'operator_actions'] LOOP
    EXECUTE format('CREATE TRIGGER a0_tenant_guard BEFORE INSERT OR UPDATE ON public.%I '
                   'FOR EACH ROW EXECUTE FUNCTION fencecheck.guard_tenant()', t);
  END LOOP;
END
$$;

-- Who may do what (worker contract v2, section 7), replacing 005's grants.
--
-- The worker group writes exactly the columns its statements write
-- (English seed section 12: tighten table-level UPDATE permissions) and
-- the control plane exactly its own; 008's guard holds every such write to
-- the protocol. Neither group may DELETE or TRUNCATE anything, touch
-- public.tenant_bindings, create objects anywhere, use a sequence (identity
-- columns need none), or execute any function but session_tenant (which
-- every policy calls as the querying role).
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['tenants', 'agent_tasks', 'agent_runs', 'agent_checkpoints',
                           'tool_operations', 'outbox', 'consumed_events', 'consumer_effects',
                           'operator_actions'] LOOP
    EXECUTE format('ALTER TABLE public.%I OWNER TO fencecheck_owner', t);
    EXECUTE format('REVOKE ALL ON public.%I FROM PUBLIC, fencecheck_worker, fencecheck_operator', t);
  END LOOP;
END
$$;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM PUBLIC, fencecheck_worker, fencecheck_operator;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
REVOKE ALL ON SCHEMA fencecheck FROM PUBLIC;
GRANT USAGE ON SCHEMA fencecheck TO fencecheck_worker, fencecheck_operator;

-- Functions: executable by nobody but as listed (PostgreSQL grants EXECUTE
-- to PUBLIC by default). Trigger functions need no EXECUTE right to fire.
DO $$
DECLARE
  f record;
BEGIN
  FOR f IN SELECT p.oid::regprocedure AS sig FROM pg_catalog.pg_proc p
            WHERE p.pronamespace = 'fencecheck'::regnamespace LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO fencecheck_owner', f.sig);
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC, fencecheck_worker, fencecheck_operator', f.sig);
  END LOOP;
END
$$;
GRANT EXECUTE ON FUNCTION fencecheck.session_tenant() TO fencecheck_worker, fencecheck_operator;

-- Both read their tenant's rows (row level security scopes every read).
GRANT SELECT ON public.tenants, public.agent_tasks, public.agent_runs, public.agent_checkpoints,
  public.tool_operations, public.outbox, public.consumed_events, public.consumer_effects
  TO fencecheck_worker, fencecheck_operator;
GRANT SELECT ON public.operator_actions TO fencecheck_operator;

-- The worker: leases and protected writes on the run, checkpoints, the
-- ledger's intents and its dispatch/reconcile moves, the outbox and its
-- relay mark, the consumer's own two tables.
GRANT UPDATE (status, revision, owner, epoch, lease_expires_at, next_attempt_at, attempt_count,
              current_step, checkpoint_schema_version, terminal_reason, updated_at)
  ON public.agent_runs TO fencecheck_worker;
GRANT INSERT ON public.agent_checkpoints, public.outbox, public.tool_operations,
  public.consumed_events, public.consumer_effects TO fencecheck_worker;
GRANT UPDATE (status, dispatch_owner, dispatch_until, remote_id, result, evidence, revision,
              updated_at)
  ON public.tool_operations TO fencecheck_worker;
GRANT UPDATE (published_at) ON public.outbox TO fencecheck_worker;

-- The control plane: tasks and runs (create, retry), its moves of the
-- state table, the ledger's cancel / callback / resolution and the
-- automatic reconciler, the events of its moves, its audit rows.
GRANT INSERT ON public.tenants, public.agent_tasks, public.agent_runs, public.outbox,
  public.operator_actions TO fencecheck_operator;
GRANT UPDATE (active_run_id, updated_at) ON public.agent_tasks TO fencecheck_operator;
GRANT UPDATE (status, owner, lease_expires_at, next_attempt_at, terminal_reason, input,
              max_attempts, updated_at)
  ON public.agent_runs TO fencecheck_operator;
GRANT UPDATE (status, dispatch_owner, dispatch_until, remote_id, result, evidence, revision,
              updated_at)
  ON public.tool_operations TO fencecheck_operator;

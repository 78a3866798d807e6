-- Ownership and rights. The worker role reads every table (RLS scopes it to
-- its tenant) and writes exactly the columns the Go statements write
-- (English seed section 12: tighten table-level UPDATE permissions).
-- Contract v2 moves the control plane (create, retry, cancel, callbacks) to
-- an operator role: its INSERT on tasks/runs and the cancel/callback
-- columns move to that role here, in this one file.
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['tenants', 'agent_tasks', 'agent_runs', 'agent_checkpoints',
                           'tool_operations', 'outbox', 'consumed_events', 'consumer_effects'] LOOP
    EXECUTE format('ALTER TABLE public.%I OWNER TO fencecheck_owner', t);
    EXECUTE format('REVOKE ALL ON public.%I FROM PUBLIC', t);
    EXECUTE format('GRANT SELECT, INSERT ON public.%I TO fencecheck_worker', t);
  END LOOP;
END
$$;
ALTER SCHEMA fencecheck OWNER TO fencecheck_owner;
ALTER FUNCTION fencecheck.session_tenant() OWNER TO fencecheck_owner;
ALTER FUNCTION fencecheck.guard_fence() OWNER TO fencecheck_owner;
REVOKE ALL ON FUNCTION fencecheck.guard_fence() FROM PUBLIC;
GRANT USAGE ON SCHEMA fencecheck TO fencecheck_worker;
GRANT UPDATE (active_run_id, updated_at) ON public.agent_tasks TO fencecheck_worker;
GRANT UPDATE (status, revision, owner, epoch, lease_expires_at, next_attempt_at, attempt_count,
              current_step, checkpoint_schema_version, terminal_reason, updated_at)
  ON public.agent_runs TO fencecheck_worker;
GRANT UPDATE (status, dispatch_owner, dispatch_until, remote_id, result, evidence, revision,
              updated_at)
  ON public.tool_operations TO fencecheck_worker;
GRANT UPDATE (published_at) ON public.outbox TO fencecheck_worker;

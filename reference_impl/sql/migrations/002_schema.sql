-- Tables of the protocol (worker contract, section 6). Every table carries
-- tenant_id and is under row level security; every table and function is
-- owned by fencecheck_owner; the worker role gets SELECT only (plus the
-- consumer's own business tables) and writes through fencecheck.* functions.

CREATE SCHEMA IF NOT EXISTS fencecheck;

CREATE TABLE public.tenants (
  tenant_id  uuid PRIMARY KEY,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Logical task: stable across retries; active_run_id switches in the same
-- transaction that creates the retry run.
CREATE TABLE public.agent_tasks (
  tenant_id     uuid NOT NULL REFERENCES public.tenants (tenant_id),
  task_id       text NOT NULL CHECK (task_id <> ''),
  active_run_id uuid,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (tenant_id, task_id)
);

-- One execution. The lease lives here: owner, epoch (the fencing token,
-- never reset) and lease_expires_at (database time).
CREATE TABLE public.agent_runs (
  run_id           uuid PRIMARY KEY,
  tenant_id        uuid NOT NULL,
  task_id          text NOT NULL,
  status           text NOT NULL DEFAULT 'queued' CHECK (status IN (
                     'queued', 'running', 'waiting_tool', 'paused_indoubt',
                     'paused_human', 'succeeded', 'failed', 'cancelled')),
  revision         bigint NOT NULL DEFAULT 0 CHECK (revision >= 0),
  owner            text,
  epoch            bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
  lease_expires_at timestamptz,
  next_attempt_at  timestamptz NOT NULL DEFAULT '-infinity',
  attempt_count    integer NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
  max_attempts     integer NOT NULL DEFAULT 12 CHECK (max_attempts > 0),
  current_step     text,
  checkpoint_schema_version integer,
  input            jsonb NOT NULL DEFAULT '{}'::jsonb,
  terminal_reason  text,
  retry_of         uuid REFERENCES public.agent_runs (run_id),
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  FOREIGN KEY (tenant_id, task_id) REFERENCES public.agent_tasks (tenant_id, task_id),
  -- A lease is an owner together with an expiry, or neither.
  CONSTRAINT lease_pair CHECK ((owner IS NULL) = (lease_expires_at IS NULL)),
  -- Only running / waiting_tool hold a lease. A lease that expired but was
  -- not yet taken over keeps its owner and status: expiry is judged by
  -- comparing lease_expires_at with clock_timestamp(), never by clearing it.
  CONSTRAINT lease_status CHECK ((status IN ('running', 'waiting_tool')) = (owner IS NOT NULL))
);
ALTER TABLE public.agent_tasks
  ADD FOREIGN KEY (active_run_id) REFERENCES public.agent_runs (run_id) DEFERRABLE INITIALLY DEFERRED;

-- Claim paths: due queued runs, and leases that may have expired.
CREATE INDEX agent_runs_claim_queued_idx
  ON public.agent_runs (tenant_id, next_attempt_at, created_at)
  WHERE status = 'queued';
CREATE INDEX agent_runs_claim_expired_idx
  ON public.agent_runs (tenant_id, lease_expires_at)
  WHERE status IN ('running', 'waiting_tool');
CREATE INDEX agent_runs_task_idx ON public.agent_runs (tenant_id, task_id, created_at DESC);

-- One row per revision: the state a protected write committed.
CREATE TABLE public.agent_checkpoints (
  run_id         uuid NOT NULL REFERENCES public.agent_runs (run_id),
  revision       bigint NOT NULL CHECK (revision > 0),
  tenant_id      uuid NOT NULL,
  epoch          bigint NOT NULL,
  owner          text NOT NULL,
  transition     text NOT NULL,
  state_json     jsonb NOT NULL,
  state_hash     bytea NOT NULL,
  schema_version integer NOT NULL,
  event_id       uuid NOT NULL UNIQUE,
  created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (run_id, revision)
);

-- Side-effect ledger: one row per business intent (operation_id).
CREATE TABLE public.tool_operations (
  operation_id    text PRIMARY KEY,
  tenant_id       uuid NOT NULL,
  run_id          uuid NOT NULL REFERENCES public.agent_runs (run_id),
  step_id         text NOT NULL,
  effect_version  integer NOT NULL CHECK (effect_version > 0),
  tool_name       text NOT NULL,
  tool_capability text NOT NULL CHECK (tool_capability IN
                    ('idempotent', 'deterministic_id', 'query', 'none')),
  idempotency_key text NOT NULL,
  request_digest  text NOT NULL,
  request_body    jsonb NOT NULL,
  status          text NOT NULL CHECK (status IN
                    ('prepared', 'dispatching', 'unknown', 'succeeded', 'failed_final', 'cancelled')),
  dispatch_owner  text,
  dispatch_until  timestamptz,
  remote_id       text,
  result          jsonb,
  evidence        jsonb NOT NULL DEFAULT '[]'::jsonb,
  revision        bigint NOT NULL DEFAULT 0 CHECK (revision >= 0),
  created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
  UNIQUE (run_id, step_id, effect_version),
  UNIQUE (tool_name, idempotency_key),
  -- A claim is an owner with a deadline.
  CONSTRAINT dispatch_claim CHECK (status <> 'dispatching'
                                   OR (dispatch_owner IS NOT NULL AND dispatch_until IS NOT NULL))
);
CREATE INDEX tool_operations_prepared_idx
  ON public.tool_operations (tenant_id, updated_at) WHERE status = 'prepared';
CREATE INDEX tool_operations_reconcile_idx
  ON public.tool_operations (tenant_id, status, dispatch_until, updated_at)
  WHERE status IN ('dispatching', 'unknown');
CREATE INDEX tool_operations_run_idx ON public.tool_operations (run_id);

CREATE TABLE public.outbox (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  event_id     uuid NOT NULL UNIQUE,
  tenant_id    uuid NOT NULL,
  run_id       uuid NOT NULL REFERENCES public.agent_runs (run_id),
  event_type   text NOT NULL,
  payload      jsonb NOT NULL,
  published_at timestamptz,
  created_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX outbox_pending_idx ON public.outbox (tenant_id, id) WHERE published_at IS NULL;

-- The consumer's own tables: dedup by event_id, then the business effect,
-- in one transaction of the consumer.
CREATE TABLE public.consumed_events (
  consumer_name text NOT NULL,
  event_id      uuid NOT NULL,
  tenant_id     uuid NOT NULL DEFAULT NULLIF(current_setting('app.tenant_id', true), '')::uuid,
  consumed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (consumer_name, event_id)
);
-- No unique key on purpose: a duplicated business effect must be visible.
CREATE TABLE public.consumer_effects (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  consumer_name text NOT NULL,
  event_id      uuid NOT NULL,
  tenant_id     uuid NOT NULL DEFAULT NULLIF(current_setting('app.tenant_id', true), '')::uuid,
  effect        text NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Terminal states never change again (a retry is a new run).
CREATE FUNCTION fencecheck.guard_terminal() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF OLD.status IN ('succeeded', 'failed', 'cancelled') AND NEW.status <> OLD.status THEN
    RAISE EXCEPTION 'run % is % (terminal) and cannot become %', OLD.run_id, OLD.status, NEW.status
      USING ERRCODE = 'FC004';
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER agent_runs_terminal_guard BEFORE UPDATE OF status ON public.agent_runs
  FOR EACH ROW EXECUTE FUNCTION fencecheck.guard_terminal();

-- Tenant isolation: every tenant table, also for the owning role (FORCE), so
-- the SECURITY DEFINER functions see the caller's tenant only. Unset or empty
-- app.tenant_id matches nothing (fail closed).
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['tenants', 'agent_tasks', 'agent_runs', 'agent_checkpoints',
                           'tool_operations', 'outbox', 'consumed_events', 'consumer_effects'] LOOP
    EXECUTE format('ALTER TABLE public.%I OWNER TO fencecheck_owner', t);
    EXECUTE format('ALTER TABLE public.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('ALTER TABLE public.%I FORCE ROW LEVEL SECURITY', t);
    EXECUTE format(
      'CREATE POLICY tenant_isolation ON public.%I
         USING (tenant_id = NULLIF(current_setting(''app.tenant_id'', true), '''')::uuid)
         WITH CHECK (tenant_id = NULLIF(current_setting(''app.tenant_id'', true), '''')::uuid)', t);
    EXECUTE format('REVOKE ALL ON public.%I FROM PUBLIC', t);
    EXECUTE format('GRANT SELECT ON public.%I TO fencecheck_worker', t);
  END LOOP;
END
$$;
ALTER FUNCTION fencecheck.guard_terminal() OWNER TO fencecheck_owner;

-- The consumer is the one writer that is not the protocol: its dedup row and
-- its business effect are its own, written in its own transaction.
GRANT INSERT ON public.consumed_events, public.consumer_effects TO fencecheck_worker;
ALTER SCHEMA fencecheck OWNER TO fencecheck_owner;
GRANT USAGE ON SCHEMA fencecheck TO fencecheck_worker;

-- The tables of worker contract section 6, in this worker's own DDL (not the
-- Python implementation's migrations): the same names and columns, because
-- the harness's checkers read them. The shape follows the Chinese seed's
-- schema (section 4) with the lease kept on agent_runs as the contract says:
-- owner, epoch (the fencing token, never reset) and lease_expires_at.
-- Nothing here decides a protocol step: the Go code's statements do
-- (internal/protocol/statements.go). What is here are the constraints the
-- seeds put in the database because they are the easiest to bypass.

CREATE SCHEMA IF NOT EXISTS fencecheck;

CREATE TABLE public.tenants (
  tenant_id  uuid PRIMARY KEY,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE public.agent_tasks (
  tenant_id     uuid NOT NULL REFERENCES public.tenants (tenant_id),
  task_id       text NOT NULL CHECK (task_id <> ''),
  active_run_id uuid,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (tenant_id, task_id)
);

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
  -- Chinese seed section 4: a lease is an owner with an expiry, or neither;
  -- only running / waiting_tool hold one. Expiry never clears the owner: it
  -- is judged against clock_timestamp().
  CONSTRAINT lease_pair CHECK ((owner IS NULL) = (lease_expires_at IS NULL)),
  CONSTRAINT lease_status CHECK ((status IN ('running', 'waiting_tool')) = (owner IS NOT NULL))
);
ALTER TABLE public.agent_tasks
  ADD FOREIGN KEY (active_run_id) REFERENCES public.agent_runs (run_id) DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX agent_runs_claim_queued_idx ON public.agent_runs (next_attempt_at, created_at)
  WHERE status = 'queued';
CREATE INDEX agent_runs_claim_expired_idx ON public.agent_runs (lease_expires_at)
  WHERE status IN ('running', 'waiting_tool');
CREATE INDEX agent_runs_task_idx ON public.agent_runs (tenant_id, task_id, created_at DESC);

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
  CONSTRAINT dispatch_claim CHECK (status <> 'dispatching'
                                   OR (dispatch_owner IS NOT NULL AND dispatch_until IS NOT NULL))
);
CREATE INDEX tool_operations_prepared_idx ON public.tool_operations (updated_at)
  WHERE status = 'prepared';
CREATE INDEX tool_operations_reconcile_idx ON public.tool_operations (status, dispatch_until, updated_at)
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
CREATE INDEX outbox_pending_idx ON public.outbox (id) WHERE published_at IS NULL;

-- The consumer's own tables (Chinese seed section 11): the dedup row and the
-- business effect, written in one transaction of the consumer.
CREATE TABLE public.consumed_events (
  consumer_name text NOT NULL,
  event_id      uuid NOT NULL,
  tenant_id     uuid NOT NULL,
  consumed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (consumer_name, event_id)
);
-- No unique key on purpose: a duplicated business effect must be visible.
CREATE TABLE public.consumer_effects (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  consumer_name text NOT NULL,
  event_id      uuid NOT NULL,
  tenant_id     uuid NOT NULL,
  effect        text NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

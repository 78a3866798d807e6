-- fencecheck worker contract v2: the database a worker's `migrate` leaves
-- behind (docs/worker-contract.md, sections 6 and 7).
--
-- What this file is: every table, column, type, NOT NULL, key and CHECK the
-- harness's checkers rely on, the two group roles, the tenant binding and
-- row level security keyed on it. A worker may apply it as it is (run as a
-- superuser, inside its own `migrate`; every statement is idempotent), or
-- create the same shapes its own way. `fencecheck contract` applies this
-- file to a scratch database and compares the catalog of the worker's
-- database with it: each table here must exist with each column here, of
-- the same type and nullability, and each key here must be a unique index
-- of the worker's (primary key, unique constraint or unique index). A worker
-- may add tables, columns, keys (a surrogate key of its own included),
-- indexes, constraints and triggers.
--
-- What it is not: the protocol. Who may change which row, and how (SQL
-- functions the worker role may execute, or plain statements guarded by
-- triggers), is the worker's own; section 7 states the properties
-- experiment N checks from the catalog and with raw sessions of the roles.
-- CHECK constraints and foreign keys below are part of the contract's
-- meaning; the conformance check does not compare them (they are judged by
-- the experiments, e.g. a run leaves its lease only through the statuses
-- listed here).
--
-- Initial values (a new run has status queued, revision 0, epoch 0,
-- attempt_count 0) are judged from the row create_run leaves, not from the
-- column defaults: the defaults below are one way to get them.

-- ------------------------------------------------------------ roles
-- Cluster-wide, while `migrate` runs per database (several at once against
-- one cluster): create each only when missing; losing the race is success.
-- fencecheck_owner is a recommendation, not a requirement: a NOLOGIN,
-- non-superuser owner of the tables keeps FORCE'd row level security in
-- force for anything running with the owner's rights (a superuser bypasses
-- row level security whatever the table says).
DO $$
DECLARE
  r text;
BEGIN
  FOREACH r IN ARRAY ARRAY['fencecheck_owner', 'fencecheck_worker', 'fencecheck_operator'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
      BEGIN
        EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS', r);
      EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;  -- another database's migrate created it first
      END;
    END IF;
  END LOOP;
END
$$;

CREATE SCHEMA IF NOT EXISTS fencecheck;

-- ------------------------------------------------------------ tenant binding (section 7)
-- A session's tenant is its LOGIN role's row here; written only by the
-- superuser who deploys (the harness inserts one row per login role).
CREATE TABLE IF NOT EXISTS public.tenant_bindings (
  role_name name PRIMARY KEY,
  tenant_id uuid NOT NULL
);
REVOKE ALL ON public.tenant_bindings FROM PUBLIC;
GRANT SELECT ON public.tenant_bindings TO fencecheck_owner;
ALTER TABLE public.tenant_bindings ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.tenant_bindings FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own_binding ON public.tenant_bindings;
CREATE POLICY own_binding ON public.tenant_bindings FOR SELECT
  USING (role_name = session_user);

-- The one place a session's tenant comes from: session_user only (no
-- argument, no setting, no current_user), so no session can change it.
CREATE OR REPLACE FUNCTION fencecheck.session_tenant() RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT b.tenant_id FROM public.tenant_bindings b WHERE b.role_name = session_user
$$;
ALTER FUNCTION fencecheck.session_tenant() OWNER TO fencecheck_owner;
REVOKE ALL ON FUNCTION fencecheck.session_tenant() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencecheck.session_tenant() TO fencecheck_worker, fencecheck_operator;
GRANT USAGE ON SCHEMA fencecheck TO fencecheck_worker, fencecheck_operator;

-- ------------------------------------------------------------ tables (section 6)

-- A logical task: stable across retries; active_run_id is its live run.
CREATE TABLE IF NOT EXISTS public.agent_tasks (
  tenant_id     uuid NOT NULL,
  task_id       text NOT NULL CHECK (task_id <> ''),
  active_run_id uuid,
  PRIMARY KEY (tenant_id, task_id)
);

-- One execution of a task. The lease lives here: owner, epoch (the fencing
-- token, +1 on every grant, never reset) and lease_expires_at (database
-- time). revision counts the run's protected writes.
CREATE TABLE IF NOT EXISTS public.agent_runs (
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
  updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  FOREIGN KEY (tenant_id, task_id) REFERENCES public.agent_tasks (tenant_id, task_id),
  -- A lease is an owner with an expiry, or neither; only running and
  -- waiting_tool hold one. Expiry never clears the owner: it is judged by
  -- comparing lease_expires_at with the database's clock.
  CONSTRAINT lease_pair CHECK ((owner IS NULL) = (lease_expires_at IS NULL)),
  CONSTRAINT lease_status CHECK ((status IN ('running', 'waiting_tool')) = (owner IS NOT NULL))
);

-- One row per revision of a run (1..revision, no gap): the state a
-- protected write committed, under which lease. Never updated or deleted.
-- state_hash is sha256 of state_json as canonical JSON (keys sorted, no
-- spaces: separators "," and ":").
CREATE TABLE IF NOT EXISTS public.agent_checkpoints (
  run_id         uuid NOT NULL REFERENCES public.agent_runs (run_id),
  revision       bigint NOT NULL CHECK (revision > 0),
  tenant_id      uuid NOT NULL,
  epoch          bigint NOT NULL,
  owner          text NOT NULL,
  state_json     jsonb NOT NULL,
  state_hash     bytea NOT NULL,
  schema_version integer NOT NULL,
  event_id       uuid NOT NULL UNIQUE,
  created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (run_id, revision)
);

-- The side-effect ledger: one row per business intent (operation_id).
-- operation_id, run_id, step_id, effect_version, tool_name and
-- request_digest never change; a changed intent is a new effect_version.
CREATE TABLE IF NOT EXISTS public.tool_operations (
  operation_id        text PRIMARY KEY,
  tenant_id           uuid NOT NULL,
  run_id              uuid NOT NULL REFERENCES public.agent_runs (run_id),
  step_id             text NOT NULL,
  effect_version      integer NOT NULL CHECK (effect_version > 0),
  tool_name           text NOT NULL,
  idempotency_key     text NOT NULL,
  request_digest      text NOT NULL,
  status              text NOT NULL CHECK (status IN (
                        'prepared', 'dispatching', 'unknown', 'succeeded', 'failed_final',
                        'cancelled')),
  dispatch_owner      text,
  dispatch_until      timestamptz,
  remote_id           text,
  revision            bigint NOT NULL DEFAULT 0 CHECK (revision >= 0),
  updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  retention_ms        bigint CHECK (retention_ms IS NULL OR retention_ms >= 0),
  first_dispatched_at timestamptz,
  UNIQUE (run_id, step_id, effect_version),
  UNIQUE (tool_name, idempotency_key),
  -- A dispatch claim is an owner with a deadline.
  CONSTRAINT dispatch_claim CHECK (status <> 'dispatching'
                                   OR (dispatch_owner IS NOT NULL AND dispatch_until IS NOT NULL))
);

-- Events to publish; a protected write inserts exactly one, with the
-- checkpoint's event_id, in its own transaction.
CREATE TABLE IF NOT EXISTS public.outbox (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  event_id     uuid NOT NULL UNIQUE,
  tenant_id    uuid NOT NULL,
  run_id       uuid NOT NULL REFERENCES public.agent_runs (run_id),
  event_type   text NOT NULL,
  payload      jsonb NOT NULL,
  published_at timestamptz,
  created_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The consumer's own tables: its dedup row and its business effect, in one
-- transaction of the consumer.
CREATE TABLE IF NOT EXISTS public.consumed_events (
  consumer_name text NOT NULL,
  event_id      uuid NOT NULL,
  tenant_id     uuid NOT NULL DEFAULT fencecheck.session_tenant(),
  consumed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (consumer_name, event_id)
);
-- No unique key on purpose: a duplicated business effect must be visible.
CREATE TABLE IF NOT EXISTS public.consumer_effects (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  consumer_name text NOT NULL,
  event_id      uuid NOT NULL,
  tenant_id     uuid NOT NULL DEFAULT fencecheck.session_tenant(),
  effect        text NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per operator decision (optional: only with the optional
-- control-plane ops resolve_indoubt, decide, converge_operation).
CREATE TABLE IF NOT EXISTS public.operator_actions (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id    uuid NOT NULL,
  run_id       uuid REFERENCES public.agent_runs (run_id) ON DELETE SET NULL,
  operation_id text,
  action       text NOT NULL,
  operator     name NOT NULL DEFAULT session_user,
  reason       text NOT NULL CHECK (reason <> ''),
  ticket       text,
  before       jsonb,
  after        jsonb,
  at           timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- ------------------------------------------------------------ isolation (section 7)
-- Every table with a tenant column: row level security enabled and forced,
-- keyed on the session's binding. Both groups read their tenant's rows;
-- the worker group inserts only the consumer's own two tables.
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['agent_tasks', 'agent_runs', 'agent_checkpoints', 'tool_operations',
                           'outbox', 'consumed_events', 'consumer_effects',
                           'operator_actions'] LOOP
    EXECUTE format('ALTER TABLE public.%I OWNER TO fencecheck_owner', t);
    EXECUTE format('ALTER TABLE public.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('ALTER TABLE public.%I FORCE ROW LEVEL SECURITY', t);
    EXECUTE format('DROP POLICY IF EXISTS tenant_isolation ON public.%I', t);
    EXECUTE format(
      'CREATE POLICY tenant_isolation ON public.%I
         USING (tenant_id = (SELECT fencecheck.session_tenant()))
         WITH CHECK (tenant_id = (SELECT fencecheck.session_tenant()))', t);
    EXECUTE format('REVOKE ALL ON public.%I FROM PUBLIC', t);
    EXECUTE format('GRANT SELECT ON public.%I TO fencecheck_worker, fencecheck_operator', t);
  END LOOP;
END
$$;
GRANT INSERT ON public.consumed_events, public.consumer_effects TO fencecheck_worker;
ALTER SCHEMA fencecheck OWNER TO fencecheck_owner;

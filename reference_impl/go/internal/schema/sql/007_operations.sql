-- The operational half of contract v2: the operator's audit trail, and what
-- the ledger keeps of a tool's promise (its idempotency key retention).

-- One row per operator decision (Chinese seed section 12): who, why, which
-- ticket, the run (and operation) before and after, at database time. The
-- control plane writes it in the decision's own transaction
-- (internal/protocol/operator.go); `operator` and `at` are the database's,
-- never the caller's (trigger below).
CREATE TABLE public.operator_actions (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id    uuid NOT NULL DEFAULT fencecheck.session_tenant(),
  run_id       uuid REFERENCES public.agent_runs (run_id),
  operation_id text,
  action       text NOT NULL,
  operator     name NOT NULL DEFAULT session_user,
  reason       text NOT NULL CHECK (btrim(reason) <> ''),
  ticket       text,
  before       jsonb,
  after        jsonb,
  at           timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX operator_actions_run_idx ON public.operator_actions (run_id, id);
ALTER TABLE public.operator_actions ENABLE ROW LEVEL SECURITY;
ALTER TABLE public.operator_actions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON public.operator_actions
  USING (tenant_id = (SELECT fencecheck.session_tenant()))
  WITH CHECK (tenant_id = (SELECT fencecheck.session_tenant()));

CREATE FUNCTION fencecheck.stamp_operator_action() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF current_setting('is_superuser') <> 'on' THEN
    NEW.operator := session_user;
    NEW.at := clock_timestamp();
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER operator_actions_stamp BEFORE INSERT ON public.operator_actions
  FOR EACH ROW EXECUTE FUNCTION fencecheck.stamp_operator_action();

-- What the tool promised when the intent was registered: how long it keeps
-- an idempotency key (NULL: no bounded key memory, or no key at all), and
-- when the first request under the key may have left (the first dispatch
-- claim, set by the ledger guard of 008: never later than the tool's own
-- receipt, so a window judged from it ends no later than the tool's).
ALTER TABLE public.tool_operations
  ADD COLUMN retention_ms bigint CHECK (retention_ms IS NULL OR retention_ms >= 0),
  ADD COLUMN first_dispatched_at timestamptz;

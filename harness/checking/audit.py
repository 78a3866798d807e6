"""The audit trail the harness installs itself in every experiment database.

A worker's own account of who held which epoch, or of what it wrote, is
never evidence; this trigger is. It is added after the worker's ``migrate``
and read by the checkers as superuser.

Invariants:
- every INSERT, UPDATE and DELETE of a contract table (worker contract,
  section 6) is recorded with the database's time (``clock_timestamp()``),
  the start time of its transaction (``now()``), the transaction id, the
  session's ``application_name`` and login role, the client's top-level
  statement (``current_query()``, truncated) and the old and new row as jsonb;
- the worker role can neither read nor write the trail: the schema has no
  grant for it and the trigger function is SECURITY DEFINER, owned by the
  superuser that installs it;
- a contract table the worker did not create is skipped (the checkers then
  see no change of it), never an error at install time.
"""

from __future__ import annotations

# Every table of the worker contract, section 6.
CONTRACT_TABLES = (
    "agent_tasks",
    "agent_runs",
    "agent_checkpoints",
    "tool_operations",
    "outbox",
    "consumed_events",
    "consumer_effects",
)

# How much of the client's top-level statement is kept per change: enough to
# tell a worker's write paths apart (section "Write paths" of the contract).
STATEMENT_CHARS = 400

AUDIT_SQL = f"""
CREATE SCHEMA IF NOT EXISTS fencecheck_audit;
REVOKE ALL ON SCHEMA fencecheck_audit FROM PUBLIC;
CREATE TABLE IF NOT EXISTS fencecheck_audit.changes (
  seq bigserial PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  tx_start timestamptz NOT NULL DEFAULT now(),
  txid bigint NOT NULL DEFAULT txid_current(),
  app text NOT NULL DEFAULT current_setting('application_name'),
  db_user text NOT NULL DEFAULT session_user,
  statement text DEFAULT left(current_query(), {STATEMENT_CHARS}),
  tbl text NOT NULL,
  op text NOT NULL,
  old jsonb,
  new jsonb
);
REVOKE ALL ON fencecheck_audit.changes FROM PUBLIC;
CREATE OR REPLACE FUNCTION fencecheck_audit.record_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
  INSERT INTO fencecheck_audit.changes (tbl, op, old, new)
  VALUES (TG_TABLE_NAME, TG_OP,
          CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
          CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END);
  RETURN NULL;
END $$;
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY[{", ".join(f"'{t}'" for t in CONTRACT_TABLES)}] LOOP
    IF to_regclass(format('public.%I', t)) IS NOT NULL THEN
      EXECUTE format('DROP TRIGGER IF EXISTS fencecheck_audit ON public.%I', t);
      EXECUTE format('CREATE TRIGGER fencecheck_audit AFTER INSERT OR UPDATE OR DELETE '
                     'ON public.%I FOR EACH ROW EXECUTE FUNCTION fencecheck_audit.record_change()',
                     t);
    END IF;
  END LOOP;
END $$;
-- The lease history in the columns the scenarios read (owner, epoch,
-- revision, status, expiry, before and after each change of agent_runs).
CREATE OR REPLACE VIEW fencecheck_audit.run_changes AS
SELECT seq, at, txid, app, op,
       (coalesce(new, old)->>'run_id')::uuid AS run_id,
       new->>'status' AS status, new->>'owner' AS owner,
       (new->>'epoch')::bigint AS epoch, (new->>'revision')::bigint AS revision,
       (new->>'lease_expires_at')::timestamptz AS lease_expires_at,
       old->>'status' AS old_status, old->>'owner' AS old_owner,
       (old->>'epoch')::bigint AS old_epoch, (old->>'revision')::bigint AS old_revision,
       (old->>'lease_expires_at')::timestamptz AS old_lease_expires_at
  FROM fencecheck_audit.changes WHERE tbl = 'agent_runs';
REVOKE ALL ON fencecheck_audit.run_changes FROM PUBLIC;
"""

"""The audit trail the harness installs itself in every experiment database.

A worker's own account of who held which epoch is never evidence; this
trigger is. It is added after the worker's ``migrate`` and read by the
checkers as superuser.
"""

from __future__ import annotations

# The harness's own witness of lease history: a trigger it installs itself on
# agent_runs, recording every change of owner, epoch, revision and status with
# the database's time and transaction id. SECURITY DEFINER so the worker role
# needs no grant on the audit table and cannot write to it directly.
AUDIT_SQL = """
CREATE SCHEMA IF NOT EXISTS fencecheck_audit;
REVOKE ALL ON SCHEMA fencecheck_audit FROM PUBLIC;
CREATE TABLE IF NOT EXISTS fencecheck_audit.run_changes (
  seq bigserial PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  txid bigint NOT NULL DEFAULT txid_current(),
  app text NOT NULL DEFAULT current_setting('application_name'),
  op text NOT NULL,
  run_id uuid NOT NULL,
  status text, owner text, epoch bigint, revision bigint, lease_expires_at timestamptz,
  old_status text, old_owner text, old_epoch bigint, old_revision bigint,
  old_lease_expires_at timestamptz
);
CREATE OR REPLACE FUNCTION fencecheck_audit.record_run_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
  INSERT INTO fencecheck_audit.run_changes
    (op, run_id, status, owner, epoch, revision, lease_expires_at,
     old_status, old_owner, old_epoch, old_revision, old_lease_expires_at)
  VALUES (TG_OP, NEW.run_id, NEW.status, NEW.owner, NEW.epoch, NEW.revision,
          NEW.lease_expires_at,
          CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
          CASE WHEN TG_OP = 'UPDATE' THEN OLD.owner END,
          CASE WHEN TG_OP = 'UPDATE' THEN OLD.epoch END,
          CASE WHEN TG_OP = 'UPDATE' THEN OLD.revision END,
          CASE WHEN TG_OP = 'UPDATE' THEN OLD.lease_expires_at END);
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS fencecheck_audit_runs ON public.agent_runs;
CREATE TRIGGER fencecheck_audit_runs AFTER INSERT OR UPDATE ON public.agent_runs
  FOR EACH ROW EXECUTE FUNCTION fencecheck_audit.record_run_change();
"""

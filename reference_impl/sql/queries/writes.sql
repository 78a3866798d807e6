-- name: protected_write_fast
-- The whole protected write in one autocommit round trip (fast path): lock + validate lease, CAS revision, ledger, checkpoint, outbox.
SELECT revision, status, lock_wait_ms, ledger_status
  FROM fencecheck.protected_write_fast(
    %(run_id)s, %(owner)s, %(epoch)s, %(expected_revision)s, %(transition)s,
    %(state)s, %(state_hash)s, %(schema_version)s, %(current_step)s,
    %(event_id)s, %(event_type)s, %(payload)s, %(effect)s);

-- name: protected_write
-- Second half of the stepped protected write (after lock_lease): re-lock + validate lease, CAS revision, ledger, checkpoint, outbox.
SELECT revision, status, lock_wait_ms, ledger_status
  FROM fencecheck.protected_write(
    %(run_id)s, %(owner)s, %(epoch)s, %(expected_revision)s, %(transition)s,
    %(state)s, %(state_hash)s, %(schema_version)s, %(current_step)s,
    %(event_id)s, %(event_type)s, %(payload)s, %(effect)s);

-- name: lock_lease
-- First half of the stepped protected write: lock the lease row and validate it (raises on failure).
SELECT revision, status, current_step, lock_wait_ms
  FROM fencecheck.lock_lease(%(run_id)s, %(owner)s, %(epoch)s);

-- name: readback_by_event
-- After an unknown commit: did the checkpoint of that revision with that event_id, and the outbox row, commit?
SELECT EXISTS (SELECT 1 FROM agent_checkpoints c
                WHERE c.run_id = %(run_id)s AND c.revision = %(revision)s
                  AND c.event_id = %(event_id)s) AS checkpoint,
       EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = %(event_id)s) AS outbox;

-- name: commits_wait_for_standby
-- Whether a COMMIT here waits for a synchronous standby: then a commit found by read-back may not have reached it.
SELECT current_setting('synchronous_standby_names') <> ''
       AND current_setting('synchronous_commit') NOT IN ('off', 'local') AS waits;

-- name: run_state
-- The run row as the worker may read it (tenant-scoped by RLS).
SELECT run_id, task_id, status, revision, owner, epoch, lease_expires_at, current_step,
       checkpoint_schema_version, attempt_count, max_attempts, input, terminal_reason,
       lease_expires_at > clock_timestamp() AS lease_live
  FROM agent_runs WHERE run_id = %(run_id)s;

-- name: latest_checkpoint
-- The checkpoint at the run's current revision (none before the first protected write).
SELECT c.revision, c.epoch, c.owner, c.state_json, c.state_hash, c.schema_version, c.event_id
  FROM agent_runs r
  JOIN agent_checkpoints c ON c.run_id = r.run_id AND c.revision = r.revision
 WHERE r.run_id = %(run_id)s;

-- name: create_run
-- New task with its first run (queued), active_run_id set in the same transaction.
SELECT run_id, task_id FROM fencecheck.create_run(%(task_id)s, %(input)s, %(max_attempts)s);

-- name: retry_run
-- New run_id under the same task; active_run_id switched in the same transaction.
SELECT run_id, task_id, retry_of FROM fencecheck.retry_run(%(task_id)s);

-- name: cancel_run
-- Operator cancel: prepared operations forbidden, in-flight ones left as they are; audited.
SELECT run_status, operations, audit_id
  FROM fencecheck.operator_cancel(%(run_id)s, %(reason)s, %(ticket)s);

-- name: resolve_indoubt
-- Operator resolves an operation in doubt (executed / not_executed); the paused run is queued again; audited.
SELECT run_status, operation_status, audit_id
  FROM fencecheck.operator_resolve(%(run_id)s, %(operation_id)s, %(decision)s, %(remote_id)s,
                                   %(reason)s, %(ticket)s);

-- name: operator_lock_run
-- Lock the run row for an operator decision taken in steps (point after_operator_lock follows).
SELECT fencecheck.operator_lock_run(%(run_id)s) AS status;

-- name: decide_human
-- Operator decides a run paused for a human: approve, supplement or terminate; audited.
SELECT run_status, audit_id
  FROM fencecheck.operator_decide(%(run_id)s, %(decision)s, %(supplement)s, %(reason)s, %(ticket)s);

-- name: converge_operation
-- Operator converges an unknown operation to a fact a person established; audited.
SELECT operation_status, audit_id
  FROM fencecheck.operator_converge(%(operation_id)s, %(outcome)s, %(remote_id)s, %(reason)s,
                                    %(ticket)s);

-- name: paused_runs
-- Runs paused in doubt or for a human, with their operations and the evidence kept on them.
SELECT r.run_id, r.task_id, r.status, r.revision, r.epoch, r.attempt_count, r.max_attempts,
       r.terminal_reason, r.current_step, r.updated_at,
       extract(epoch FROM clock_timestamp() - r.updated_at)::float8 AS paused_for_s,
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                   'operation_id', o.operation_id, 'step_id', o.step_id,
                   'effect_version', o.effect_version, 'tool', o.tool_name,
                   'capability', o.tool_capability, 'status', o.status,
                   'remote_id', o.remote_id, 'evidence', o.evidence) ORDER BY o.created_at)
                   FROM tool_operations o WHERE o.run_id = r.run_id), '[]'::jsonb) AS operations
  FROM agent_runs r
 WHERE r.status IN ('paused_indoubt', 'paused_human')
 ORDER BY r.updated_at;

-- name: operator_actions
-- The audit trail of operator decisions on one run.
SELECT id, action, operator, reason, ticket, before, after, at, operation_id
  FROM operator_actions WHERE run_id = %(run_id)s ORDER BY id;

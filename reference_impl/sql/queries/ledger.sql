-- name: dispatch_claim
-- Claim one prepared operation of a live run (optionally a given one) with a deadline, SKIP LOCKED.
SELECT operation_id, run_id, step_id, tool_name, tool_capability, request_body, request_digest,
       status, dispatch_owner, dispatch_until, revision
  FROM fencecheck.dispatch_claim(%(dispatch_owner)s, %(ttl_ms)s, %(operation_id)s);

-- name: record_tool_result
-- Ledger-only result write by the dispatcher; matches dispatch owner, ledger revision and digest.
SELECT outcome, status, revision
  FROM fencecheck.record_tool_result(%(operation_id)s, %(dispatch_owner)s, %(expected_revision)s,
                                     %(request_digest)s, %(outcome)s, %(remote_id)s, %(result)s);

-- name: mark_unknown
-- Our own live claim got no definite answer: unknown, never failed, never prepared.
SELECT outcome, status, revision
  FROM fencecheck.ledger_mark_unknown(%(operation_id)s, %(dispatch_owner)s,
                                      %(expected_revision)s, %(error)s);

-- name: return_rejected
-- The tool proved it did not act (429): the intent may be dispatched again later.
SELECT outcome, status, revision
  FROM fencecheck.ledger_return_rejected(%(operation_id)s, %(dispatch_owner)s,
                                         %(expected_revision)s, %(error)s);

-- name: expire_claims
-- Reconciler: dispatch claims past their deadline become unknown.
SELECT operation_id, from_status, to_status FROM fencecheck.reconcile_expire_claims(%(limit)s);

-- name: unknown_operations
-- Operations whose outcome is unknown, oldest first, with the run's status.
SELECT o.operation_id, o.run_id, o.tool_name, o.tool_capability, o.request_body, o.request_digest,
       o.revision, o.updated_at, r.status AS run_status,
       (o.retention_ms IS NULL OR o.first_dispatched_at IS NULL
        OR clock_timestamp() < o.first_dispatched_at + o.retention_ms * interval '1 millisecond')
         AS key_remembered
  FROM tool_operations o JOIN agent_runs r ON r.run_id = o.run_id
 WHERE o.status = 'unknown'
 ORDER BY o.updated_at
 LIMIT %(limit)s;

-- name: converge
-- Unknown operation converges to the remote fact found by query.
SELECT outcome, status, revision
  FROM fencecheck.ledger_converge(%(operation_id)s, %(expected_revision)s, %(outcome)s,
                                  %(remote_id)s, %(result)s, %(evidence)s);

-- name: claim_retry
-- Same-key retry of an unknown operation (idempotent tools, live runs only).
SELECT operation_id, run_id, step_id, tool_name, tool_capability, request_body, request_digest,
       status, dispatch_owner, dispatch_until, revision
  FROM fencecheck.ledger_claim_retry(%(dispatch_owner)s, %(ttl_ms)s, %(operation_id)s,
                                     %(expected_revision)s);

-- name: add_evidence
-- Keep a late or refused answer as evidence on the ledger row.
SELECT fencecheck.ledger_add_evidence(%(operation_id)s, %(evidence)s) AS found;

-- name: operation
-- One ledger row.
SELECT operation_id, run_id, step_id, effect_version, tool_name, tool_capability,
       idempotency_key, request_digest, request_body, status, dispatch_owner, dispatch_until,
       dispatch_until <= clock_timestamp() AS claim_expired, remote_id, result, revision,
       (retention_ms IS NULL OR first_dispatched_at IS NULL
        OR clock_timestamp() < first_dispatched_at + retention_ms * interval '1 millisecond')
         AS key_remembered
  FROM tool_operations WHERE operation_id = %(operation_id)s;

-- name: step_operations
-- Every effect version of one step of a run, oldest first.
SELECT operation_id, effect_version, status, remote_id, result, request_digest
  FROM tool_operations WHERE run_id = %(run_id)s AND step_id = %(step_id)s
 ORDER BY effect_version;

-- name: deliver_callback
-- A tool callback; accepted only for the named run's own operation while that run is active and live.
SELECT fencecheck.deliver_callback(%(run_id)s, %(operation_id)s, %(payload)s) AS accepted;

-- name: run_epoch
-- The run's current epoch: what a dispatcher that is not the lease holder sends with a request.
SELECT epoch FROM agent_runs WHERE run_id = %(run_id)s;

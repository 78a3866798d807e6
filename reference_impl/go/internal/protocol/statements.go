package protocol

// Statements is every SQL statement the worker runs, by role. Each protocol
// decision lives in one of them (or in the Go code that reads its result);
// a mutant swaps exactly one. Durations travel as integer milliseconds
// (English seed section 5.1), never as interval text; every time is the
// database's clock_timestamp().
type Statements struct {
	// Leases (rule 1).
	Claim, Takeover, LeaseMiss, Renew, Release string
	// The protected write (rules 2, 3; English seed section 6 + Chinese 6, 8).
	LockLease, ValidateLease, CAS, InsertCheckpoint, InsertOutbox, ReadBack string
	// The ledger halves of a protected write: Tx1 (intent), Tx2 (result), freeze.
	RegisterIntent, ExistingIntent, Tx2Result, AdoptResult, FreezeLedger string
	// Dispatcher and reconciler (rule 4; English seed section 9).
	DispatchClaim, RecordResult, MarkUnknown, ReturnRejected, ExpiredClaims, ExpireClaim string
	UnknownOps, Converge, ResumeRun, ClaimRetry, AddEvidence, Operation, StepVersions    string
	LockRunOfOperation, ActiveRunOfTaskOf                                                string
	// Control plane (rules 6, 7) and the operator's decisions (contract section 7).
	CreateTenant, CreateTask, CreateRun                         string
	LockTask, ActiveRun, InsertRetryRun, SwitchTask             string
	LockRun, OperatorMove, CancelPrepared, MoveEvent, OpsOfRun  string
	LockOperation, CallbackLive, CallbackRefuse, CallbackAccept string
	InDoubtLeft, ActiveRunOfTask                                string
	ResolveOperation, RunSnapshot, Audit                        string
	// Whether an operation (its row locked by the caller) is under a live dispatch claim.
	ClaimLive string
	// The run's epoch as committed after a dispatch claim (what a request carries).
	RunEpoch                    string
	PausedRuns, OperatorActions string
	RunState, LatestCheckpoint  string
	// Retention (the optional op purge): the pick, the guarded deletion.
	PurgeCandidates, PurgeTask string
	// Outbox relay and consumer (rule 10; Chinese seed section 11).
	OutboxLockBatch, OutboxMark, ConsumeDedup, ConsumeEffect string
	// Durability contract (rule 11).
	DurabilitySettings, ReplicationView string
}

// Runnable: a queued run whose next attempt is due, or a lease that expired.
const runnable = `((status = 'queued' AND next_attempt_at <= clock_timestamp())
        OR (status IN ('running', 'waiting_tool') AND lease_expires_at <= clock_timestamp()))`

// DefaultStatements are the correct ones.
func DefaultStatements() Statements {
	return Statements{
		// ClaimRun, Chinese seed section 5: one candidate, row-locked with
		// SKIP LOCKED so concurrent claimers pass each other's rows, then the
		// grant: owner, epoch + 1, expiry by database time.
		Claim: `WITH candidate AS (
  SELECT run_id FROM agent_runs
   WHERE ` + runnable + `
   ORDER BY status = 'queued', next_attempt_at, created_at, run_id
   FOR UPDATE SKIP LOCKED
   LIMIT 1
)
UPDATE agent_runs AS r
   SET status = CASE WHEN r.status = 'waiting_tool' THEN 'waiting_tool' ELSE 'running' END,
       owner = $1,
       lease_expires_at = clock_timestamp() + ($2::bigint * interval '1 millisecond'),
       epoch = r.epoch + 1,
       attempt_count = CASE WHEN r.status = 'queued' THEN r.attempt_count + 1 ELSE r.attempt_count END,
       updated_at = clock_timestamp()
  FROM candidate AS c
 WHERE r.run_id = c.run_id
RETURNING r.run_id::text, r.status, r.revision, r.epoch, r.current_step, r.owner, r.lease_expires_at`,

		// Acquire or takeover of one run, English seed section 5.1: an UPDATE,
		// so it waits on the row lock of a protected write in progress and
		// PostgreSQL re-checks the condition on the row that write left.
		Takeover: `UPDATE agent_runs
   SET owner = $2,
       epoch = epoch + 1,
       lease_expires_at = clock_timestamp() + ($3::bigint * interval '1 millisecond'),
       status = CASE WHEN status = 'queued' THEN 'running' ELSE status END,
       attempt_count = attempt_count + CASE WHEN status = 'queued' THEN 1 ELSE 0 END,
       updated_at = clock_timestamp()
 WHERE run_id = $1
   AND ` + runnable + `
RETURNING run_id::text, status, revision, epoch, current_step, owner, lease_expires_at`,

		// Why a lease statement matched no row (English seed: query
		// additionally to distinguish; never a task failure).
		LeaseMiss: `SELECT status, owner, epoch,
       COALESCE(lease_expires_at > clock_timestamp(), false) AS live,
       next_attempt_at > clock_timestamp() AS not_due
  FROM agent_runs WHERE run_id = $1`,

		// Renewal, English seed section 5.2 with the Chinese seed's status
		// check: owner, epoch AND unexpired, so an expired lease nobody took
		// over yet is never revived.
		Renew: `UPDATE agent_runs
   SET lease_expires_at = clock_timestamp() + ($4::bigint * interval '1 millisecond'),
       updated_at = clock_timestamp()
 WHERE run_id = $1 AND owner = $2 AND epoch = $3
   AND lease_expires_at > clock_timestamp()
   AND status IN ('running', 'waiting_tool')
RETURNING lease_expires_at`,

		// Release: do NOT zero the epoch; the run goes back to the queue. In
		// its last attempt it gives that attempt back (schema 016): a release
		// interrupts an attempt, it does not end one.
		Release: `UPDATE agent_runs
   SET owner = NULL, lease_expires_at = NULL, status = 'queued',
       max_attempts = GREATEST(max_attempts, attempt_count + 1),
       next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE run_id = $1 AND owner = $2 AND epoch = $3
   AND status IN ('running', 'waiting_tool')`,

		// SaveCheckpoint, English seed section 6: lock the lease row ...
		LockLease: `SELECT run_id FROM agent_runs WHERE run_id = $1 FOR UPDATE`,
		// ... then validate in a statement of its own, so the clock is read
		// after the lock was granted, not before the wait ...
		ValidateLease: `SELECT owner IS NOT DISTINCT FROM $2 AND epoch = $3 AS holder,
       COALESCE(lease_expires_at > clock_timestamp(), false) AS live,
       revision, status, attempt_count, max_attempts
  FROM agent_runs WHERE run_id = $1`,
		// ... then CAS the revision (the Go code chose status and lease from
		// the transition); values come back from RETURNING.
		CAS: `UPDATE agent_runs
   SET revision = revision + 1,
       status = $3,
       owner = CASE WHEN $4::boolean THEN NULL ELSE owner END,
       lease_expires_at = CASE WHEN $4::boolean THEN NULL ELSE lease_expires_at END,
       next_attempt_at = CASE WHEN $5::bigint IS NULL THEN next_attempt_at
                              ELSE clock_timestamp() + ($5::bigint * interval '1 millisecond') END,
       terminal_reason = COALESCE($6, terminal_reason),
       current_step = COALESCE($7, current_step),
       checkpoint_schema_version = $8,
       updated_at = clock_timestamp()
 WHERE run_id = $1 AND revision = $2
RETURNING revision, status, tenant_id::text`,
		// Chinese seed section 6: checkpoint row and outbox row in the same
		// transaction as the revision.
		InsertCheckpoint: `INSERT INTO agent_checkpoints
  (run_id, revision, tenant_id, epoch, owner, transition, state_json, state_hash, schema_version, event_id)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10)`,
		InsertOutbox: `INSERT INTO outbox (event_id, tenant_id, run_id, event_type, payload)
VALUES ($1, $2, $3, $4, $5::jsonb)`,
		// Chinese seed section 6.1: after an unknown commit, which of the two
		// rows carrying this event_id exist.
		ReadBack: `SELECT EXISTS (SELECT 1 FROM agent_checkpoints
                WHERE run_id = $1 AND revision = $2 AND event_id = $3) AS checkpoint,
       EXISTS (SELECT 1 FROM outbox WHERE event_id = $3) AS outbox`,

		// Tx1, Chinese seed section 8.1 / English 9.1: the intent, prepared.
		// The tool's declared key retention is kept with the intent ($10).
		RegisterIntent: `INSERT INTO tool_operations (
  operation_id, tenant_id, run_id, step_id, effect_version, tool_name, tool_capability,
  idempotency_key, request_digest, request_body, status, retention_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $1, $8, $9::jsonb, 'prepared', $10)
ON CONFLICT DO NOTHING`,
		// A key conflict is no licence to resend: read what is registered.
		ExistingIntent: `SELECT run_id::text, tool_name, request_digest, status
  FROM tool_operations WHERE operation_id = $1`,
		// Tx2, Chinese seed section 8.2: only the dispatch claim that sent the
		// request may record its answer.
		Tx2Result: `UPDATE tool_operations
   SET status = $6, remote_id = $7, result = $8::jsonb, dispatch_until = NULL,
       revision = revision + 1, updated_at = clock_timestamp()
 WHERE operation_id = $1 AND run_id = $2 AND status = 'dispatching'
   AND dispatch_owner = $3 AND revision = $4 AND request_digest = $5`,
		AdoptResult: `SELECT status FROM tool_operations WHERE operation_id = $1 AND run_id = $2`,
		// Chinese seed section 8.3: our own live claim becomes unknown (never
		// prepared; a new ledger revision); the freeze is kept as evidence
		// either way. Only while the operation is still in doubt: one that
		// converged since the workflow read it (another reconciler, a
		// callback, an operator) matches no row, and the whole write rolls
		// back, as the Python worker's migration 011 does (found by
		// W[converged_before_freeze]: this worker paused a run in doubt with
		// nothing in doubt, which nobody resumes).
		FreezeLedger: `UPDATE tool_operations
   SET status = CASE WHEN status = 'dispatching' AND dispatch_owner = $3 AND revision = $4
                     THEN 'unknown' ELSE status END,
       dispatch_owner = CASE WHEN status = 'dispatching' AND dispatch_owner = $3 AND revision = $4
                             THEN NULL ELSE dispatch_owner END,
       dispatch_until = CASE WHEN status = 'dispatching' AND dispatch_owner = $3 AND revision = $4
                             THEN NULL ELSE dispatch_until END,
       revision = CASE WHEN status = 'dispatching' AND dispatch_owner = $3 AND revision = $4
                       THEN revision + 1 ELSE revision END,
       evidence = evidence || jsonb_build_array(jsonb_build_object(
                    'at', clock_timestamp(), 'event', 'run_frozen', 'error', $5::jsonb)),
       updated_at = clock_timestamp()
 WHERE operation_id = $1 AND run_id = $2 AND status IN ('unknown', 'dispatching')`,

		// Dispatcher claim, English seed section 9.2: prepared operations of
		// live runs only, SKIP LOCKED, with a deadline.
		DispatchClaim: `WITH candidate AS (
  SELECT o.operation_id
    FROM tool_operations o
    JOIN agent_runs r ON r.run_id = o.run_id
   WHERE o.status = 'prepared'
     AND r.status IN ('queued', 'running', 'waiting_tool')
     AND ($3::text IS NULL OR o.operation_id = $3)
   ORDER BY o.updated_at
   FOR UPDATE OF o SKIP LOCKED
   LIMIT 1
)
UPDATE tool_operations o
   SET status = 'dispatching', dispatch_owner = $1,
       dispatch_until = clock_timestamp() + ($2::bigint * interval '1 millisecond'),
       revision = o.revision + 1, updated_at = clock_timestamp()
  FROM candidate c
 WHERE o.operation_id = c.operation_id
RETURNING o.operation_id, o.run_id::text, o.step_id, o.tool_name, o.tool_capability,
          o.request_body, o.request_digest, o.revision,
          (SELECT r.epoch FROM agent_runs r WHERE r.run_id = o.run_id)`,
		// The run's epoch read after the claim committed, in a statement of its
		// own: a takeover that committed while the claim statement ran is
		// invisible to the claim's own snapshot.
		RunEpoch: `SELECT epoch FROM agent_runs WHERE run_id = $1`,
		// English seed section 9.3: a result only for the claim that sent it.
		RecordResult: `UPDATE tool_operations
   SET status = $5, remote_id = $6, result = $7::jsonb, dispatch_until = NULL,
       revision = revision + 1, updated_at = clock_timestamp()
 WHERE operation_id = $1 AND status = 'dispatching'
   AND dispatch_owner = $2 AND revision = $3 AND request_digest = $4`,
		// A timeout / lost answer on our own live claim: unknown, never failed.
		MarkUnknown: `UPDATE tool_operations
   SET status = 'unknown', dispatch_owner = NULL, dispatch_until = NULL,
       evidence = evidence || jsonb_build_array(jsonb_build_object(
         'at', clock_timestamp(), 'event', 'outcome_unknown', 'dispatch_owner', $2::text, 'error', $4::jsonb)),
       revision = revision + 1, updated_at = clock_timestamp()
 WHERE operation_id = $1 AND status = 'dispatching' AND dispatch_owner = $2 AND revision = $3`,
		// 429 is the tool's proof it did not act: the intent may go again.
		ReturnRejected: `UPDATE tool_operations
   SET status = 'prepared', dispatch_owner = NULL, dispatch_until = NULL,
       evidence = evidence || jsonb_build_array(jsonb_build_object(
         'at', clock_timestamp(), 'event', 'rejected_retryable', 'dispatch_owner', $2::text, 'error', $4::jsonb)),
       revision = revision + 1, updated_at = clock_timestamp()
 WHERE operation_id = $1 AND status = 'dispatching' AND dispatch_owner = $2 AND revision = $3`,
		ExpiredClaims: `SELECT operation_id, dispatch_owner, revision FROM tool_operations
 WHERE status = 'dispatching' AND dispatch_until <= clock_timestamp()
 ORDER BY dispatch_until LIMIT $1`,
		// English seed section 9.2, the reconciler's statement: the claim's
		// owner and revision stay in the condition, so a row re-claimed or
		// written back meanwhile is left alone. A row another session holds
		// is passed by (SKIP LOCKED), as the SQL sweep does: the next cycle
		// expires it, and one held row never stalls every reconciler.
		ExpireClaim: `UPDATE tool_operations
   SET status = 'unknown', dispatch_owner = NULL, dispatch_until = NULL,
       evidence = evidence || jsonb_build_array(jsonb_build_object(
         'at', clock_timestamp(), 'event', 'claim_expired', 'dispatch_owner', $2::text)),
       revision = revision + 1, updated_at = clock_timestamp()
 WHERE operation_id = (SELECT operation_id FROM tool_operations
   WHERE operation_id = $1 AND status = 'dispatching' AND dispatch_owner = $2
     AND revision = $3 AND dispatch_until <= clock_timestamp()
   FOR UPDATE SKIP LOCKED)`,
		UnknownOps: `SELECT o.operation_id, o.run_id::text, o.tool_name, o.tool_capability, o.request_digest, o.revision, r.status
  FROM tool_operations o JOIN agent_runs r ON r.run_id = o.run_id
 WHERE o.status = 'unknown' ORDER BY o.updated_at LIMIT $1`,
		Converge: `UPDATE tool_operations
   SET status = $3, remote_id = $4, result = $5::jsonb,
       evidence = evidence || jsonb_build_array(jsonb_build_object(
         'at', clock_timestamp(), 'event', 'converged', 'evidence', $6::jsonb)),
       revision = revision + 1, updated_at = clock_timestamp()
 WHERE operation_id = $1 AND status = 'unknown' AND revision = $2`,
		// Taken before ResumeRun, in a statement of its own (see resumeRun).
		LockRunOfOperation: `SELECT 1 FROM agent_runs r
 WHERE r.run_id = (SELECT o.run_id FROM tool_operations o WHERE o.operation_id = $1) FOR UPDATE`,
		// The run of operation $1 and its task's active run, read once the
		// run's row is locked (see resumeRun).
		ActiveRunOfTaskOf: `SELECT r.run_id::text, t.active_run_id::text
  FROM tool_operations o JOIN agent_runs r ON r.run_id = o.run_id
  JOIN agent_tasks t ON t.tenant_id = r.tenant_id AND t.task_id = r.task_id
 WHERE o.operation_id = $1`,
		// A run paused in doubt whose operations all converged goes back to
		// the queue (Chinese seed 8.3: confirmed -> forward); its worker
		// continues from the ledger. A run a retry superseded ($2 false) is
		// never queued again: it ends cancelled, reason $3 (contract
		// section 5, retry_run; migration 013). Queued at a spent budget, it
		// gets back the attempt the pause interrupted (migration 015).
		ResumeRun: `UPDATE agent_runs r
   SET status = CASE WHEN $2::boolean THEN 'queued' ELSE 'cancelled' END,
       next_attempt_at = CASE WHEN $2::boolean THEN clock_timestamp() ELSE r.next_attempt_at END,
       terminal_reason = CASE WHEN $2::boolean THEN r.terminal_reason ELSE $3::text END,
       max_attempts = CASE WHEN $2::boolean AND r.attempt_count >= r.max_attempts
                           THEN r.attempt_count + 1 ELSE r.max_attempts END,
       updated_at = clock_timestamp()
 WHERE r.run_id = (SELECT o.run_id FROM tool_operations o WHERE o.operation_id = $1)
   AND r.status = 'paused_indoubt'
   AND NOT EXISTS (SELECT 1 FROM tool_operations o
                    WHERE o.run_id = r.run_id AND o.status IN ('unknown', 'dispatching'))`,
		// Same-key retry: only tools that promise a second create with the same
		// key makes no second resource, only while the run is live, and only
		// while the tool still remembers the key: the retry's claim must end
		// before the declared retention, counted from the first dispatch.
		ClaimRetry: `UPDATE tool_operations o
   SET status = 'dispatching', dispatch_owner = $1,
       dispatch_until = clock_timestamp() + ($2::bigint * interval '1 millisecond'),
       evidence = o.evidence || jsonb_build_array(jsonb_build_object(
         'at', clock_timestamp(), 'event', 'same_key_retry', 'dispatch_owner', $1::text)),
       revision = o.revision + 1, updated_at = clock_timestamp()
 WHERE o.operation_id = $3 AND o.status = 'unknown' AND o.revision = $4
   AND o.tool_capability IN ('idempotent', 'deterministic_id')
   AND (o.tool_capability <> 'idempotent' OR o.retention_ms IS NULL OR o.first_dispatched_at IS NULL
        OR clock_timestamp() + ($2::bigint * interval '1 millisecond')
           < o.first_dispatched_at + o.retention_ms * interval '1 millisecond')
   AND EXISTS (SELECT 1 FROM agent_runs r
                WHERE r.run_id = o.run_id AND r.status IN ('queued', 'running', 'waiting_tool'))
RETURNING o.operation_id, o.run_id::text, o.step_id, o.tool_name, o.tool_capability,
          o.request_body, o.request_digest, o.revision,
          (SELECT r.epoch FROM agent_runs r WHERE r.run_id = o.run_id)`,
		AddEvidence: `UPDATE tool_operations
   SET evidence = evidence || jsonb_build_array(jsonb_build_object('at', clock_timestamp()) || $2::jsonb)
 WHERE operation_id = $1`,
		Operation: `SELECT operation_id, run_id::text, step_id, tool_name, tool_capability, request_body,
       request_digest, status, dispatch_owner, COALESCE(dispatch_until <= clock_timestamp(), false),
       remote_id, revision, result
  FROM tool_operations WHERE operation_id = $1`,
		// A step's effect versions, newest first (a re-planned effect is a new version).
		StepVersions: `SELECT effect_version, status FROM tool_operations
 WHERE run_id = $1 AND step_id = $2 ORDER BY effect_version DESC`,

		CreateTenant: `INSERT INTO tenants (tenant_id) VALUES ($1) ON CONFLICT DO NOTHING`,
		CreateTask: `INSERT INTO agent_tasks (tenant_id, task_id, active_run_id) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING`,
		CreateRun: `INSERT INTO agent_runs (run_id, tenant_id, task_id, input, max_attempts)
VALUES ($1, $2, $3, $4::jsonb, $5)`,
		LockTask: `SELECT tenant_id::text, active_run_id::text FROM agent_tasks WHERE task_id = $1 FOR UPDATE`,
		// Locked: a resume of the old run (which holds this lock) either
		// committed first (the retry then reads it queued: refused) or waits
		// for the retry and then reads the task's new active run.
		ActiveRun: `SELECT status, input, max_attempts FROM agent_runs WHERE run_id = $1 FOR UPDATE`,
		// English seed section 7: a retry is a new run_id; the old run stays.
		InsertRetryRun: `INSERT INTO agent_runs (run_id, tenant_id, task_id, input, max_attempts, retry_of)
VALUES ($1, $2, $3, $4::jsonb, $5, $6)`,
		SwitchTask: `UPDATE agent_tasks SET active_run_id = $3, updated_at = clock_timestamp()
 WHERE tenant_id = $1 AND task_id = $2`,
		LockRun: `SELECT status, tenant_id::text, epoch, revision FROM agent_runs WHERE run_id = $1 FOR UPDATE`,
		// An operator's move of the state table ($4: the status it moves
		// from, read under the row lock): the lease (if any) is given up; a
		// supplement ($5) joins the input; a run whose attempt budget ran out
		// gets one more attempt when it is queued again.
		OperatorMove: `UPDATE agent_runs
   SET status = $2, owner = NULL, lease_expires_at = NULL,
       next_attempt_at = CASE WHEN $2 = 'queued' THEN clock_timestamp() ELSE next_attempt_at END,
       terminal_reason = CASE WHEN $2 IN ('failed', 'cancelled') THEN $3 ELSE terminal_reason END,
       input = CASE WHEN $5::jsonb IS NULL THEN input
                    ELSE input || jsonb_build_object('supplement',
                                    COALESCE(input->'supplement', '{}'::jsonb) || $5::jsonb) END,
       max_attempts = CASE WHEN $2 = 'queued' AND attempt_count >= max_attempts
                           THEN attempt_count + 1 ELSE max_attempts END,
       updated_at = clock_timestamp()
 WHERE run_id = $1 AND status = $4`,
		// English seed section 9.3: prepared -> cancelled (forbid dispatch);
		// dispatching and unknown keep their status: they may have happened.
		CancelPrepared: `UPDATE tool_operations
   SET status = 'cancelled', revision = revision + 1, updated_at = clock_timestamp()
 WHERE run_id = $1 AND status = 'prepared'`,
		MoveEvent: `INSERT INTO outbox (event_id, tenant_id, run_id, event_type, payload)
VALUES (gen_random_uuid(), $2::text::uuid, $1::text::uuid, $3,
        jsonb_build_object('run_id', $1::text, 'tenant_id', $2::text, 'from', $4::text, 'to', $5::text,
                           'reason', $6::text, 'operator', session_user))`,
		OpsOfRun:      `SELECT operation_id, status FROM tool_operations WHERE run_id = $1 ORDER BY operation_id`,
		LockOperation: `SELECT run_id::text, status FROM tool_operations WHERE operation_id = $1 FOR UPDATE`,
		// Whether anything of the run is still in doubt: a run paused in doubt
		// goes back to the queue only when nothing is (every way out alike).
		// The task's active run of run $1 (its row locked by the caller).
		ActiveRunOfTask: `SELECT t.active_run_id::text FROM agent_runs r
  JOIN agent_tasks t ON t.tenant_id = r.tenant_id AND t.task_id = r.task_id
 WHERE r.run_id = $1`,
		ClaimLive: `SELECT status = 'dispatching' AND dispatch_until > clock_timestamp()
  FROM tool_operations WHERE operation_id = $1`,
		InDoubtLeft: `SELECT EXISTS (SELECT 1 FROM tool_operations
                 WHERE run_id = $1 AND status IN ('unknown', 'dispatching'))`,
		// A callback may move only an operation of the run it names, while that
		// run is its task's active, live run (rule 7).
		CallbackLive: `SELECT EXISTS (
  SELECT 1 FROM agent_runs r JOIN agent_tasks t ON t.tenant_id = r.tenant_id AND t.task_id = r.task_id
   WHERE r.run_id = $1 AND t.active_run_id = r.run_id
     AND r.status IN ('queued', 'running', 'waiting_tool'))`,
		CallbackRefuse: `UPDATE tool_operations
   SET evidence = evidence || jsonb_build_array(jsonb_build_object(
         'at', clock_timestamp(), 'event', 'callback_refused', 'run_id', $2::text, 'payload', $3::jsonb))
 WHERE operation_id = $1`,
		CallbackAccept: `UPDATE tool_operations
   SET status = 'succeeded', remote_id = $2, result = $3::jsonb, dispatch_until = NULL,
       evidence = evidence || jsonb_build_array(jsonb_build_object(
         'at', clock_timestamp(), 'event', 'callback_accepted', 'payload', $3::jsonb)),
       revision = revision + 1, updated_at = clock_timestamp()
 WHERE operation_id = $1 AND status IN ('dispatching', 'unknown')`,
		// An operator resolves an operation in doubt by a person's finding.
		ResolveOperation: `UPDATE tool_operations
   SET status = $3, remote_id = $4, dispatch_owner = NULL, dispatch_until = NULL,
       result = jsonb_build_object('executed', $3 = 'succeeded', 'resource_id', $4::text, 'source', 'operator'),
       evidence = evidence || jsonb_build_array(jsonb_build_object(
         'at', clock_timestamp(), 'event', $5::text, 'operator', session_user,
         'reason', $6::text, 'ticket', $7::text)),
       revision = revision + 1, updated_at = clock_timestamp()
 WHERE operation_id = $1 AND run_id = $2 AND status IN ('unknown', 'dispatching')`,
		// The run (and one of its operations) as an audit row keeps it.
		RunSnapshot: `SELECT jsonb_build_object(
    'status', r.status, 'revision', r.revision, 'epoch', r.epoch, 'owner', r.owner,
    'attempt_count', r.attempt_count, 'max_attempts', r.max_attempts,
    'terminal_reason', r.terminal_reason,
    'operation', (SELECT jsonb_build_object('operation_id', o.operation_id, 'status', o.status,
                                            'remote_id', o.remote_id, 'revision', o.revision)
                    FROM tool_operations o WHERE o.operation_id = $2 AND o.run_id = r.run_id))
  FROM agent_runs r WHERE r.run_id = $1`,
		// Contract section 7: one row per operator decision, in its transaction
		// (operator and time are the database's).
		Audit: `INSERT INTO operator_actions (run_id, operation_id, action, reason, ticket, before, after)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb) RETURNING id`,
		PausedRuns: `SELECT COALESCE(jsonb_agg(jsonb_build_object(
    'run_id', r.run_id, 'task_id', r.task_id, 'status', r.status, 'revision', r.revision,
    'epoch', r.epoch, 'attempt_count', r.attempt_count, 'max_attempts', r.max_attempts,
    'terminal_reason', r.terminal_reason, 'current_step', r.current_step, 'updated_at', r.updated_at,
    'paused_for_s', extract(epoch FROM clock_timestamp() - r.updated_at)::float8,
    'operations', COALESCE((SELECT jsonb_agg(jsonb_build_object(
        'operation_id', o.operation_id, 'step_id', o.step_id, 'effect_version', o.effect_version,
        'tool', o.tool_name, 'capability', o.tool_capability, 'status', o.status,
        'remote_id', o.remote_id, 'evidence', o.evidence) ORDER BY o.created_at)
      FROM tool_operations o WHERE o.run_id = r.run_id), '[]'::jsonb)) ORDER BY r.updated_at), '[]'::jsonb)
  FROM agent_runs r WHERE r.status IN ('paused_indoubt', 'paused_human')`,
		OperatorActions: `SELECT COALESCE(jsonb_agg(jsonb_build_object(
    'id', a.id, 'action', a.action, 'operator', a.operator, 'reason', a.reason, 'ticket', a.ticket,
    'before', a.before, 'after', a.after, 'at', a.at, 'operation_id', a.operation_id) ORDER BY a.id),
    '[]'::jsonb)
  FROM operator_actions a WHERE a.run_id = $1`,
		// Retention, the pick (Chinese seed section 12): the tenant's oldest
		// tasks whose every run is terminal and untouched since the cut, with
		// no operation prepared, dispatching or unknown and every outbox row
		// published; the task row locked, SKIP LOCKED (a task another session
		// holds is passed by, never waited for). Row level security scopes it
		// to the session's tenant.
		PurgeCandidates: `SELECT k.task_id FROM agent_tasks k
 WHERE NOT EXISTS (SELECT 1 FROM agent_runs r
                    WHERE r.tenant_id = k.tenant_id AND r.task_id = k.task_id
                      AND (r.status NOT IN ('succeeded', 'failed', 'cancelled')
                           OR r.updated_at >= clock_timestamp() - ($1::bigint * interval '1 millisecond')))
   AND NOT EXISTS (SELECT 1 FROM agent_runs r JOIN tool_operations o ON o.run_id = r.run_id
                    WHERE r.tenant_id = k.tenant_id AND r.task_id = k.task_id
                      AND o.status IN ('prepared', 'dispatching', 'unknown'))
   AND NOT EXISTS (SELECT 1 FROM agent_runs r JOIN outbox x ON x.run_id = r.run_id
                    WHERE r.tenant_id = k.tenant_id AND r.task_id = k.task_id
                      AND x.published_at IS NULL)
 ORDER BY k.updated_at, k.task_id
 LIMIT $2
   FOR UPDATE OF k SKIP LOCKED`,
		// The deletion of one picked task, with every row of its runs: the
		// operator group's only way to delete (011_retention.sql), which
		// judges the task again under its locks and answers the archive
		// document of what it deleted (NULL: nothing deleted).
		PurgeTask: `SELECT fencecheck.operator_purge($1, $2)`,
		RunState: `SELECT run_id::text, task_id, status, revision, owner, epoch, lease_expires_at, current_step,
       checkpoint_schema_version, attempt_count, max_attempts, input, terminal_reason,
       COALESCE(lease_expires_at > clock_timestamp(), false)
  FROM agent_runs WHERE run_id = $1`,
		// Chinese seed section 6: read the run's version, then the snapshot
		// of that version.
		LatestCheckpoint: `SELECT c.revision, c.schema_version, c.state_json, c.state_hash
  FROM agent_runs r
  JOIN agent_checkpoints c ON c.run_id = r.run_id AND c.revision = r.revision
 WHERE r.run_id = $1`,

		// Chinese seed section 11: lock a batch, publish, mark after the ack.
		OutboxLockBatch: `SELECT id, event_id::text, run_id::text, tenant_id::text, event_type, payload
  FROM outbox WHERE published_at IS NULL
 ORDER BY id LIMIT $1
   FOR UPDATE SKIP LOCKED`,
		OutboxMark: `UPDATE outbox SET published_at = clock_timestamp()
 WHERE id = ANY($1::bigint[]) AND published_at IS NULL`,
		// The consumer's dedup row first: no row back means already processed.
		ConsumeDedup: `INSERT INTO consumed_events (consumer_name, event_id) VALUES ($1, $2)
ON CONFLICT DO NOTHING RETURNING event_id`,
		ConsumeEffect: `INSERT INTO consumer_effects (consumer_name, event_id, effect) VALUES ($1, $2, $3)`,

		DurabilitySettings: `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
       pg_is_in_recovery(), current_setting('server_version')`,
		ReplicationView: `SELECT COALESCE(application_name, ''), COALESCE(state, ''), COALESCE(sync_state, '')
  FROM pg_stat_replication`,
	}
}

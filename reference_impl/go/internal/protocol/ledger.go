package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"fencecheck/goworker/internal/injection"
	"fencecheck/goworker/internal/sealing"
	"fencecheck/goworker/internal/tool"
)

// Operation is a ledger row as the dispatcher holds it after a claim.
type Operation struct {
	OperationID string
	RunID       string
	StepID      string
	Tool        string
	Capability  string
	Request     any
	Digest      string
	Revision    int64
	RunEpoch    int64 // the run's epoch read after the claim: what every request carries
	// LocalDeadline is the claim's deadline on this process's monotonic
	// clock, from a reading taken before the claim was sent (so it ends no
	// later than the database's): Send sends only before it. A process
	// frozen between its claim and its call (SIGSTOP, a VM pause) must not
	// send under a claim that expired meanwhile: a successor may hold a
	// newer one.
	LocalDeadline time.Time
	// Resend: a same-key resend's claim of an operation that was unknown. A
	// 429 to it proves only that the resend did nothing: the request it
	// repeats may still act, so the operation stays unknown (never prepared
	// again: W[resend_refused]).
	Resend bool
}

// OperationRow is a ledger row as a workflow resuming its tool step reads it.
type OperationRow struct {
	Operation
	Status        string
	DispatchOwner *string
	ClaimExpired  bool
	RemoteID      *string
	// Result is the recorded answer (nil while there is none).
	Result map[string]any
}

// RefusedByTool: a failed_final the tool answered (a definite refusal, its
// error kept), not a person's finding or an intent retired unsent.
func (r *OperationRow) RefusedByTool() bool {
	_, ok := r.Result["error"]
	return r.Status == "failed_final" && ok
}

// Change is one reconciler decision.
type Change struct {
	OperationID string `json:"operation_id"`
	From        string `json:"from"`
	To          string `json:"to"`
}

// UnknownOp is an operation whose outcome is unknown, with its run's status.
type UnknownOp struct {
	OperationID, RunID, Tool, Capability, Digest, RunStatus string
	Revision                                                int64
}

func scanOperation(rows pgx.Rows) (*Operation, error) {
	defer rows.Close()
	if !rows.Next() {
		return nil, rows.Err()
	}
	op := new(Operation)
	var body []byte
	if err := rows.Scan(&op.OperationID, &op.RunID, &op.StepID, &op.Tool, &op.Capability, &body, &op.Digest,
		&op.Revision, &op.RunEpoch); err != nil {
		return nil, err
	}
	req, err := Decode(body)
	if err != nil {
		return nil, err
	}
	op.Request = req
	rows.Close()
	if rows.CommandTag().RowsAffected() != 1 {
		return nil, newErr("LedgerConflict", "rows", "claim changed %d rows", rows.CommandTag().RowsAffected())
	}
	return op, rows.Err()
}

// GetOperation reads one ledger row (nil when absent).
func (p *Protocol) GetOperation(ctx context.Context, q Querier, opID string) (*OperationRow, error) {
	r := new(OperationRow)
	var body, result []byte
	err := q.QueryRow(ctx, p.SQL.Operation, opID).Scan(&r.OperationID, &r.RunID, &r.StepID, &r.Tool, &r.Capability,
		&body, &r.Digest, &r.Status, &r.DispatchOwner, &r.ClaimExpired, &r.RemoteID, &r.Revision, &result)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if len(result) > 0 {
		// Any answer that is not an object names no refusal.
		_ = json.Unmarshal(result, &r.Result)
	}
	r.Request, err = Decode(body)
	return r, err
}

// DispatchClaim claims one prepared operation of a live run (English seed
// section 9.2), optionally a given one; nil when there is none to claim.
func (p *Protocol) DispatchClaim(ctx context.Context, q Querier, owner string, ttlMS int64, opID *string) (*Operation, error) {
	sent := time.Now()
	rows, err := q.Query(ctx, p.SQL.DispatchClaim, owner, ttlMS, opID)
	if err != nil {
		return nil, err
	}
	op, err := scanOperation(rows)
	if op == nil || err != nil {
		return op, err
	}
	if p.DeadlineFromAnswer {
		sent = time.Now()
	}
	op.LocalDeadline = sent.Add(time.Duration(ttlMS) * time.Millisecond)
	// The request carries the run's epoch as it stands after the claim, never
	// the sender's lease: a dispatch claim is not fenced by the lease, and a
	// worker frozen past its lease may claim its successor's intent of the
	// same step before its heartbeat notices the loss (seen in Q).
	return op, q.QueryRow(ctx, p.SQL.RunEpoch, op.RunID).Scan(&op.RunEpoch)
}

// ledgerChange runs one conditional ledger UPDATE; zero rows is a
// LedgerConflict, never silently ignored (English seed section 9.3).
func ledgerChange(ctx context.Context, q Querier, sql, opID, what string, args ...any) error {
	ok, err := execOne(ctx, q, sql, args...)
	if err != nil {
		return err
	}
	if !ok {
		return newErr("LedgerConflict", what, "ledger row %s not changed (%s): the claim no longer matches", opID, what)
	}
	return nil
}

// RecordResult writes the tool's definite answer for our claim, ledger only
// (a dispatcher not holding the run's lease): a ledger-only outcome.
//
// The answer may settle the last doubt of a run paused in doubt (its claim
// was live when the run froze): then the run goes back to the queue in the
// same transaction, as after the reconciler's convergence.
func (p *Protocol) RecordResult(ctx context.Context, q Querier, op *Operation, owner string, a tool.Answer) error {
	result, _ := json.Marshal(a.Result)
	record := func(q Querier) error {
		if err := ledgerChange(ctx, q, p.SQL.RecordResult, op.OperationID, "record",
			op.OperationID, owner, op.Revision, op.Digest, a.Kind, a.RemoteID, string(result)); err != nil {
			return err
		}
		return p.resumeRun(ctx, q, op.OperationID)
	}
	var err error
	if db, ok := q.(DB); ok {
		err = pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error { return record(tx) })
	} else {
		err = record(q) // already inside the caller's transaction
	}
	if err == nil {
		outcomeCommitted(op.RunID, op.OperationID)
	}
	return err
}

// resumeRun puts the run of opID back in the queue when it is paused in
// doubt and nothing of it is in doubt any more. The run's row is locked
// first, in a statement of its own, so the check runs on a snapshot taken
// after that lock: of two convergences of a run's last two doubts at once,
// the second sees the first's commit. One UPDATE judged its NOT EXISTS on the
// snapshot from before its wait, and neither queued the run (found by
// W[others_in_doubt], two operators converging at once).
//
// A run its task's retry superseded is not queued: it ends cancelled (two
// live runs of one task could both act at the tool). The task is read after
// the run's lock, which a retry takes too (see ActiveRun).
func (p *Protocol) resumeRun(ctx context.Context, q Querier, opID string) error {
	if _, err := q.Exec(ctx, p.SQL.LockRunOfOperation, opID); err != nil {
		return err
	}
	var runID string
	var active *string
	if err := q.QueryRow(ctx, p.SQL.ActiveRunOfTaskOf, opID).Scan(&runID, &active); err != nil {
		return err
	}
	current := active != nil && *active == runID
	_, err := q.Exec(ctx, p.SQL.ResumeRun, opID, current, supersededReason(active, "its last doubt settled"))
	return err
}

// supersededReason is the terminal reason of a run a retry superseded.
func supersededReason(active *string, why string) string {
	by := "another run"
	if active != nil {
		by = "run " + *active
	}
	return fmt.Sprintf("superseded by %s of its task (%s)", by, why)
}

// outcomeCommitted is the point after_dispatch_outcome_commit: a ledger-only
// outcome (unknown; back to prepared after a 429; the result of a dispatcher
// not holding the run's lease; the reconciler's convergence) is committed,
// the run not moved yet.
func outcomeCommitted(runID, opID string) {
	injection.Point("after_dispatch_outcome_commit", runID, nil, nil, opID)
}

// SettleWithoutResult is the ledger consequence of an answer that records
// no result: a 429 (the tool's proof it did not act) puts the intent back to
// prepared, unless the claim was a same-key resend (op.Resend); anything
// else (timeout, lost answer, 5xx, conflict) is unknown: never failed, never
// resent blindly (rule 5).
func (p *Protocol) SettleWithoutResult(ctx context.Context, q Querier, op *Operation, owner string, a tool.Answer) (string, error) {
	why, _ := json.Marshal(a.Error)
	to, what, sql := "unknown", "unknown", p.SQL.MarkUnknown
	if p.WithoutResult(a) == "prepared" && !op.Resend {
		to, what, sql = "prepared", "return", p.SQL.ReturnRejected
	}
	settle := func(q Querier) error {
		if err := ledgerChange(ctx, q, sql, op.OperationID, what, op.OperationID, owner, op.Revision, string(why)); err != nil {
			return err
		}
		if to != "prepared" {
			return nil
		}
		// Back to prepared, nothing of the run may be in doubt any more: a run
		// paused in doubt goes back to the queue in the same transaction.
		return p.resumeRun(ctx, q, op.OperationID)
	}
	var err error
	if db, ok := q.(DB); ok && to == "prepared" {
		err = pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error { return settle(tx) })
	} else {
		err = settle(q)
	}
	if err != nil {
		return to, err
	}
	outcomeCommitted(op.RunID, op.OperationID)
	return to, nil
}

// ExpireClaims turns every dispatch claim past its deadline into unknown,
// never prepared (the remote may have acted).
func (p *Protocol) ExpireClaims(ctx context.Context, q Querier) ([]Change, error) {
	rows, err := q.Query(ctx, p.SQL.ExpiredClaims, 100)
	if err != nil {
		return nil, err
	}
	type claim struct {
		op, owner string
		rev       int64
	}
	var found []claim
	for rows.Next() {
		var c claim
		if err := rows.Scan(&c.op, &c.owner, &c.rev); err != nil {
			rows.Close()
			return nil, err
		}
		found = append(found, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var changes []Change
	for _, c := range found {
		tag, err := q.Exec(ctx, p.SQL.ExpireClaim, c.op, c.owner, c.rev)
		if err != nil {
			return changes, err
		}
		if tag.RowsAffected() == 1 { // else re-claimed or written back meanwhile
			var to string
			_ = q.QueryRow(ctx, `SELECT status FROM tool_operations WHERE operation_id = $1`, c.op).Scan(&to)
			changes = append(changes, Change{c.op, "dispatching", to})
		}
	}
	if len(changes) > 0 {
		// Committed (autocommit): these claims are unknown now, none queried yet.
		injection.Point("after_claims_expired_commit", "", nil, nil, changes[0].OperationID)
	}
	return changes, nil
}

// Dispatcher sends claimed operations to the tool, never inside a
// transaction; it opens a request's sealed fields just before sending.
type Dispatcher struct {
	P     *Protocol
	Tools *tool.Client
	Owner string
	Seal  *sealing.Sealer
}

// Send calls the tool for a claim we hold, with the stable operation_id as
// its idempotency key. The context is checked right before the call: a
// cancelled execution starts no new side effect (rule 8).
func (d *Dispatcher) Send(ctx context.Context, op *Operation, epoch int64) (tool.Answer, error) {
	injection.Point("after_dispatch_claim_commit", op.RunID, &epoch, nil, op.OperationID)
	if err := ctx.Err(); err != nil {
		return tool.Answer{}, Cancelled(ctx)
	}
	if !op.LocalDeadline.IsZero() && !time.Now().Before(op.LocalDeadline) {
		// Nothing was sent, but the claim is past its deadline: send nothing.
		// Our word that nothing went out proves nothing to anyone else, so the
		// operation takes the path of every lost claim: unknown.
		injection.Record(injection.Event{Type: "fail", Op: "dispatch", RunID: op.RunID, Epoch: &epoch,
			OperationID: op.OperationID, Error: "DispatchClaimExpired"})
		return tool.Answer{Kind: "unknown", Error: map[string]any{"class": "DispatchClaimExpired", "sent": false}}, nil
	}
	request, err := d.Seal.Open(op.Request)
	if err != nil {
		return tool.Answer{}, SensitiveErr(err)
	}
	a := d.Tools.Create(op.Tool, op.OperationID, op.RunID, epoch, request)
	if body, ok := a.Error["body"]; ok {
		// The tool's answer names its resource, whose request may carry a
		// sensitive field: kept on the ledger, so sealed (contract section 9).
		sealed, err := d.Seal.Seal(body)
		if err != nil {
			return tool.Answer{}, SensitiveErr(err)
		}
		a.Error["body"] = sealed
	}
	if a.Kind == "rejected_retryable" || a.Kind == "unknown" || a.Kind == "conflict" {
		return a, nil
	}
	injection.Point("after_tool_response_before_tx2_commit", op.RunID, &epoch, nil, op.OperationID)
	return a, nil
}

// sendAndSettle sends a claim this dispatcher holds without the run's lease
// (with the run's epoch at the claim) and records the answer in the ledger.
func (d *Dispatcher) sendAndSettle(ctx context.Context, q Querier, op *Operation) (string, tool.Answer, error) {
	a, err := d.Send(ctx, op, op.RunEpoch)
	if err != nil {
		return "", a, err
	}
	status := a.Kind
	if a.Kind == "succeeded" || a.Kind == "failed_final" {
		err = d.P.RecordResult(ctx, q, op, d.Owner, a)
	} else {
		status, err = d.P.SettleWithoutResult(ctx, q, op, d.Owner, a)
	}
	return status, a, err
}

// Cycle is one standalone dispatcher cycle: claim, call, record in the ledger.
func (d *Dispatcher) Cycle(ctx context.Context, q Querier, ttlMS int64, opID *string) (map[string]any, error) {
	op, err := d.P.DispatchClaim(ctx, q, d.Owner, ttlMS, opID)
	if err != nil || op == nil {
		return map[string]any{"operation_id": opID, "status": nil, "remote_id": nil}, err
	}
	status, a, err := d.sendAndSettle(ctx, q, op)
	if err != nil {
		return nil, err
	}
	return map[string]any{"operation_id": op.OperationID, "status": status, "remote_id": a.RemoteID}, nil
}

// Reconciler converges unknown operations: query, same-key retry where the
// tool promises it, or a person (rule 4).
type Reconciler struct {
	D     *Dispatcher
	TTLMS int64
}

// Cycle expires stale claims, then tries every unknown operation.
func (r *Reconciler) Cycle(ctx context.Context, q Querier) ([]Change, error) {
	changes, err := r.D.P.ExpireClaims(ctx, q)
	if err != nil {
		return changes, err
	}
	rows, err := q.Query(ctx, r.D.P.SQL.UnknownOps, 100)
	if err != nil {
		return changes, err
	}
	var unknown []UnknownOp
	for rows.Next() {
		var u UnknownOp
		if err := rows.Scan(&u.OperationID, &u.RunID, &u.Tool, &u.Capability, &u.Digest, &u.Revision, &u.RunStatus); err != nil {
			rows.Close()
			return changes, err
		}
		unknown = append(unknown, u)
	}
	rows.Close()
	for _, u := range unknown {
		c, err := r.ReconcileOne(ctx, q, u)
		if ClassOf(err) == "LedgerConflict" {
			// Another reconciler, a person or a callback settled it since
			// the list was read: nothing of ours changed; go on.
			continue
		}
		if err != nil {
			return changes, err
		}
		if c != nil {
			changes = append(changes, *c)
		}
	}
	return changes, rows.Err()
}

// ReconcileOne tries to learn the remote fact of one unknown operation.
func (r *Reconciler) ReconcileOne(ctx context.Context, q Querier, u UnknownOp) (*Change, error) {
	if u.Capability == "none" {
		return r.D.P.ReconcileWithout(ctx, q, r, u)
	}
	found, err := r.D.Tools.Query(u.Tool, u.OperationID)
	if err != nil {
		if errors.Is(err, tool.ErrQueryUnsupported) {
			found = nil
		} else {
			return nil, nil // the tool could not be asked now; try again later
		}
	}
	// The tool answered; what it said is recorded nowhere yet.
	injection.Point("after_reconcile_query", u.RunID, nil, nil, u.OperationID)
	if found != nil {
		// The remote resource must come from THIS request body.
		if found.BodyDigest != "" && found.BodyDigest != u.Digest {
			_, err := q.Exec(ctx, r.D.P.SQL.AddEvidence, u.OperationID, `{"event": "query_digest_mismatch"}`)
			return nil, err
		}
		result, _ := json.Marshal(map[string]any{"resource_id": found.ResourceID, "resource_ids": found.ResourceIDs})
		evidence, _ := json.Marshal(map[string]any{"source": "query", "count": len(found.ResourceIDs)})
		converge := func(q Querier) error {
			err := ledgerChange(ctx, q, r.D.P.SQL.Converge, u.OperationID, "converge",
				u.OperationID, u.Revision, "succeeded", found.ResourceID, string(result), string(evidence))
			if err != nil {
				return err
			}
			// Between the two halves: a crash here must leave both or neither.
			injection.Point("after_reconcile_converge", u.RunID, nil, nil, u.OperationID)
			// Nothing of a run paused in doubt left in doubt: back to the queue.
			return r.D.P.resumeRun(ctx, q, u.OperationID)
		}
		// One transaction: a crash between the two statements must not leave a
		// run paused in doubt with nothing in doubt (nobody would resume it).
		if db, ok := q.(DB); ok && !r.D.P.ConvergeApart {
			err = pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error { return converge(tx) })
		} else {
			err = converge(q) // already inside the caller's transaction
		}
		if err != nil {
			return nil, err
		}
		outcomeCommitted(u.RunID, u.OperationID)
		return &Change{u.OperationID, "unknown", "succeeded"}, nil
	}
	live := u.RunStatus == "queued" || u.RunStatus == "running" || u.RunStatus == "waiting_tool"
	if (u.Capability == "idempotent" || u.Capability == "deterministic_id") && live {
		return r.RetrySameKey(ctx, q, u)
	}
	return nil, nil
}

// RetrySameKey resends with the original operation_id (tools that promise
// a second create with the same key makes no second resource).
func (r *Reconciler) RetrySameKey(ctx context.Context, q Querier, u UnknownOp) (*Change, error) {
	sent := time.Now()
	rows, err := q.Query(ctx, r.D.P.SQL.ClaimRetry, r.D.Owner, r.TTLMS, u.OperationID, u.Revision)
	if err != nil {
		return nil, err
	}
	op, err := scanOperation(rows)
	if err != nil || op == nil {
		return nil, err
	}
	op.Resend = true
	// As a first dispatch's claim: the resend carries the run's epoch as it
	// stands after the claim committed, not the one its RETURNING read on the
	// statement's snapshot (a claim that waited on the operation's row while
	// a takeover committed would carry the old epoch).
	if err := q.QueryRow(ctx, r.D.P.SQL.RunEpoch, op.RunID).Scan(&op.RunEpoch); err != nil {
		return nil, err
	}
	if r.D.P.ResendDeadlineFromAnswer {
		sent = time.Now()
	}
	if !r.D.P.ResendWithoutDeadline {
		op.LocalDeadline = sent.Add(time.Duration(r.TTLMS) * time.Millisecond)
	}
	status, _, err := r.D.sendAndSettle(ctx, q, op)
	if err != nil {
		return nil, err
	}
	return &Change{op.OperationID, "unknown", status}, nil
}

// leaveForPerson: no query, no idempotency: nothing automatic may resend it.
func leaveForPerson(context.Context, Querier, *Reconciler, UnknownOp) (*Change, error) {
	return nil, nil
}

// Cancelled is the error of a cancelled execution, with its cause.
func Cancelled(ctx context.Context) error {
	cause := context.Cause(ctx)
	if cause == nil {
		cause = ctx.Err()
	}
	return newErr("ExecutionCancelled", "cancelled", "execution cancelled: %v", cause)
}

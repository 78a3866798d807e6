package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"fencecheck/goworker/internal/injection"
	"fencecheck/goworker/internal/sealing"
)

// Write is one protected write (rules 2, 3). Retrying the same *Write keeps
// its event_id, which is what makes an unknown commit decidable (rule 9).
type Write struct {
	Lease            Lease
	ExpectedRevision int64
	Transition       string // start checkpoint intent tool_result succeed fail freeze pause_human requeue
	State            any
	SchemaVersion    int
	EventType        string
	Payload          map[string]any
	Step             *string
	Effect           *Effect
	EventID          string
	BackoffMS        int64 // requeue only
}

// Effect is the ledger half of an intent (Tx1), a tool result (Tx2) or a freeze.
type Effect struct {
	OperationID   string
	StepID        string
	EffectVersion int
	Tool          string
	Capability    string
	Digest        string
	Request       any
	RetentionMS   *int64 // the tool's declared key retention (idempotent tools), kept with the intent
	// Tx2: "record" our claim's answer, or "adopt" a result already in the ledger.
	Mode           string
	Outcome        string // succeeded | failed_final
	DispatchOwner  string
	LedgerRevision int64
	RemoteID       *string
	Result         any
	Error          any // freeze: why
}

// Written is a committed protected write; values from RETURNING or read-back.
type Written struct {
	Revision     int64
	Status       string
	EventID      string
	LedgerStatus string
	ReadBack     bool
}

// Writer runs protected writes on one session (one goroutine); states and
// requests are stored with their sensitive fields sealed.
type Writer struct {
	P    *Protocol
	S    *Session
	Seal *sealing.Sealer
}

// commitUnknown: the statement carrying COMMIT failed without a server verdict.
type commitUnknown struct{ cause error }

func (c *commitUnknown) Error() string { return "commit outcome unknown: " + c.cause.Error() }

// Write commits wr or says why not (LeaseLost, RevisionConflict, ...).
// Invariants: an unknown commit is read back by its event_id before anything
// else (committed: done; not committed: the same *Write again; one of two
// rows: CommitInconsistent); 40001/40P01 retry the whole transaction within
// a budget; a COMMIT answered with a WARNING is never a durable success.
func (w *Writer) Write(ctx context.Context, wr *Write) (*Written, error) {
	if wr.EventID == "" {
		wr.EventID = NewUUID()
	}
	unknownLeft, serialLeft := 2, 5
	for {
		out, err := w.attempt(ctx, wr)
		var cu *commitUnknown
		switch {
		case err == nil:
			return out, nil
		case errors.As(err, &cu):
			if unknownLeft == 0 {
				return nil, newErr("CommitOutcomeUnknown", "budget", "%v", err)
			}
			unknownLeft--
			res, rerr := w.P.ResolveUnknown(ctx, w, wr)
			if rerr != nil || res != nil {
				return res, rerr
			}
		case IsRetryableConflict(err) && serialLeft > 0:
			serialLeft--
		default:
			return nil, FromDatabase(err)
		}
	}
}

// nextStatus is the state machine of both seeds: the status after a
// transition, and whether the transition gives the lease up.
func nextStatus(transition, status string, attempts, maxAttempts int32) (string, bool, string, error) {
	switch transition {
	case "start", "tool_result":
		return "running", false, "", nil
	case "checkpoint":
		return status, false, "", nil
	case "intent":
		return "waiting_tool", false, "", nil
	case "succeed":
		return "succeeded", true, "", nil
	case "fail":
		return "failed", true, "", nil
	case "freeze":
		return "paused_indoubt", true, "", nil
	case "pause_human":
		return "paused_human", true, "", nil
	case "requeue":
		if attempts >= maxAttempts {
			return "failed", true, "attempts_exhausted", nil
		}
		return "queued", true, "", nil
	}
	return "", false, "", newErr("StateConflict", "transition", "unknown transition %q", transition)
}

// lock is the English seed's first half of SaveCheckpoint: lock the lease
// row, then validate owner + epoch + unexpired in a statement of its own.
func (w *Writer) lock(ctx context.Context, tx pgx.Tx, wr *Write) (int64, string, int32, int32, error) {
	var id string
	err := tx.QueryRow(ctx, w.P.SQL.LockLease, wr.Lease.RunID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", 0, 0, newErr("RunNotFound", "missing", "run %s not found", wr.Lease.RunID)
	}
	if err != nil {
		return 0, "", 0, 0, err
	}
	var holder, live bool
	var revision int64
	var status string
	var attempts, maxAttempts int32
	err = tx.QueryRow(ctx, w.P.SQL.ValidateLease, wr.Lease.RunID, wr.Lease.Owner, wr.Lease.Epoch).
		Scan(&holder, &live, &revision, &status, &attempts, &maxAttempts)
	if err != nil {
		return 0, "", 0, 0, err
	}
	if err := w.P.CheckLease(wr.Lease.RunID, holder, live); err != nil {
		return 0, "", 0, 0, err
	}
	return revision, status, attempts, maxAttempts, nil
}

func (w *Writer) attempt(ctx context.Context, wr *Write) (*Written, error) {
	conn, err := w.S.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if w.P.LockInOwnTx {
		// Only a mutant gets here: the lock is released before the write.
		tx, err := conn.BeginTx(ctx, ReadCommitted)
		if err != nil {
			return nil, w.S.Check(err)
		}
		_, _, _, _, err = w.lock(ctx, tx, wr)
		if err == nil {
			err = tx.Commit(ctx)
		}
		rollback(tx)
		if err != nil {
			return nil, w.S.Check(err)
		}
	}
	tx, err := conn.BeginTx(ctx, ReadCommitted)
	if err != nil {
		return nil, w.S.Check(err)
	}
	defer rollback(tx)
	revision, status, attempts, maxAttempts := int64(0), "", int32(0), int32(0)
	if w.P.LockInOwnTx {
		err = tx.QueryRow(ctx, `SELECT revision, status, attempt_count, max_attempts FROM agent_runs WHERE run_id = $1`,
			wr.Lease.RunID).Scan(&revision, &status, &attempts, &maxAttempts)
	} else {
		revision, status, attempts, maxAttempts, err = w.lock(ctx, tx, wr)
	}
	if err != nil {
		return nil, w.S.Check(err)
	}
	injection.Point("after_lease_row_locked", wr.Lease.RunID, &wr.Lease.Epoch, &revision, "")
	out, err := w.apply(ctx, tx, wr, status, attempts, maxAttempts)
	if err != nil {
		return nil, w.S.Check(err)
	}
	injection.Point("before_commit", wr.Lease.RunID, &wr.Lease.Epoch, &out.Revision, "")
	w.S.DrainWarnings()
	if err := tx.Commit(ctx); err != nil {
		if IsConnectionError(err) {
			w.S.Discard()
			return nil, &commitUnknown{err}
		}
		return nil, err // a server verdict: rolled back
	}
	if notices := w.S.DrainWarnings(); len(notices) > 0 {
		if err := w.P.CommitWarning(notices); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// apply: the revision CAS, the transition's ledger change, the checkpoint
// and the outbox row, all in tx.
func (w *Writer) apply(ctx context.Context, tx pgx.Tx, wr *Write, status string, attempts, maxAttempts int32) (*Written, error) {
	next, givesUp, reason, err := nextStatus(wr.Transition, status, attempts, maxAttempts)
	if err != nil {
		return nil, err
	}
	if reason == "" && givesUp {
		if r, ok := wr.Payload["reason"].(string); ok {
			reason = r
		}
	}
	var backoff *int64
	if wr.Transition == "requeue" {
		b := max(wr.BackoffMS, 1)
		backoff = &b
	}
	var reasonArg *string
	if reason != "" {
		reasonArg = &reason
	}
	out := &Written{EventID: wr.EventID}
	var tenant string
	ok, err := updateOne(ctx, tx, w.P.SQL.CAS,
		[]any{wr.Lease.RunID, wr.ExpectedRevision, next, givesUp, backoff, reasonArg, wr.Step, wr.SchemaVersion},
		&out.Revision, &out.Status, &tenant)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, newErr("RevisionConflict", "revision", "run %s revision is not %d", wr.Lease.RunID, wr.ExpectedRevision)
	}
	if out.LedgerStatus, err = w.ledger(ctx, tx, wr, tenant); err != nil {
		return nil, err
	}
	sealed, err := w.Seal.Seal(wr.State)
	if err != nil {
		return nil, SensitiveErr(err)
	}
	state, err := Canonical(sealed)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, w.P.SQL.InsertCheckpoint, wr.Lease.RunID, out.Revision, tenant, wr.Lease.Epoch,
		wr.Lease.Owner, wr.Transition, string(state), StateHash(state), wr.SchemaVersion, wr.EventID); err != nil {
		return nil, err
	}
	payload, err := json.Marshal(wr.Payload)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, w.P.SQL.InsertOutbox, wr.EventID, tenant, wr.Lease.RunID, wr.EventType, string(payload)); err != nil {
		return nil, err
	}
	return out, nil
}

// ledger is the transition's change of the side-effect ledger, if any.
func (w *Writer) ledger(ctx context.Context, tx pgx.Tx, wr *Write, tenant string) (string, error) {
	e := wr.Effect
	if e == nil {
		return "", nil
	}
	switch wr.Transition {
	case "intent":
		sealed, err := w.Seal.Seal(e.Request)
		if err != nil {
			return "", SensitiveErr(err)
		}
		body, err := Canonical(sealed)
		if err != nil {
			return "", err
		}
		tag, err := tx.Exec(ctx, w.P.SQL.RegisterIntent, e.OperationID, tenant, wr.Lease.RunID, e.StepID,
			e.EffectVersion, e.Tool, e.Capability, e.Digest, string(body), e.RetentionMS)
		var pg *pgconn.PgError
		if errors.As(err, &pg) && pg.Code == "FC006" {
			// The ledger guard (008): an earlier version of the step may have
			// happened, so this one is another intent for the step: refused.
			return "", newErr("IntentConflict", "intent", "%s", pg.Message)
		}
		if err != nil {
			return "", err
		}
		if tag.RowsAffected() == 1 {
			return "prepared", nil
		}
		var run, tool, digest, status string
		err = tx.QueryRow(ctx, w.P.SQL.ExistingIntent, e.OperationID).Scan(&run, &tool, &digest, &status)
		if err != nil || run != wr.Lease.RunID || tool != e.Tool || digest != e.Digest {
			return "", newErr("IntentConflict", "intent", "intent %s conflicts with a different registered intent", e.OperationID)
		}
		return status, nil // the same intent, registered before
	case "tool_result":
		if e.Mode == "adopt" {
			var status string
			err := tx.QueryRow(ctx, w.P.SQL.AdoptResult, e.OperationID, wr.Lease.RunID).Scan(&status)
			if err != nil || (status != "succeeded" && status != "failed_final") {
				return "", newErr("LedgerConflict", "adopt", "operation %s has no final result to adopt", e.OperationID)
			}
			return status, nil
		}
		result, err := json.Marshal(e.Result)
		if err != nil {
			return "", err
		}
		ok, err := execOne(ctx, tx, w.P.SQL.Tx2Result, e.OperationID, wr.Lease.RunID, e.DispatchOwner,
			e.LedgerRevision, e.Digest, e.Outcome, e.RemoteID, string(result))
		if err != nil {
			return "", err
		}
		if !ok {
			return "", newErr("LedgerConflict", "claim", "ledger row %s does not match the dispatch claim", e.OperationID)
		}
		return e.Outcome, nil
	case "freeze":
		why, _ := json.Marshal(e.Error)
		ok, err := execOne(ctx, tx, w.P.SQL.FreezeLedger, e.OperationID, wr.Lease.RunID, e.DispatchOwner,
			e.LedgerRevision, string(why))
		if err != nil {
			return "", err
		}
		if !ok {
			return "", newErr("LedgerConflict", "not_in_doubt",
				"operation %s of run %s is not in doubt (converged meanwhile, or missing): nothing to freeze",
				e.OperationID, wr.Lease.RunID)
		}
		return "frozen", nil
	}
	return "", nil
}

// SensitiveErr names a sealing refusal in the contract's vocabulary.
func SensitiveErr(err error) error {
	if errors.Is(err, sealing.ErrNoKey) {
		return newErr("SensitiveDataWithoutKey", "no_key", "%v", err)
	}
	if errors.Is(err, sealing.ErrForged) {
		return newErr("BadRequest", "sealed_mark", "%v", err)
	}
	return err
}

// rollback ends tx, bounded: a rollback on a dead link must not hang.
func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// commitsWaitForStandby: whether a COMMIT on this server waits for a
// synchronous standby (H[sync_terminated_wait]).
const commitsWaitForStandby = `SELECT current_setting('synchronous_standby_names') <> ''
   AND current_setting('synchronous_commit') NOT IN ('off', 'local')`

// readBackResolve is rule 9 (Chinese seed section 6.1): both rows = committed;
// neither = not committed (nil, nil: the caller sends the same *Write again);
// one = CommitInconsistent. It asks on fresh connections for up to 10 s, as
// an unknown commit usually coincides with a network fault. A cancelled
// execution still asks, for up to 2 s: a read sends nothing, and a heartbeat
// refused because this very commit ended the run must not leave the worker
// in doubt of it (a cut link is not waited out: the work is cancelled).
func readBackResolve(parent context.Context, w *Writer, wr *Write) (*Written, error) {
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	ctx, cancel := context.WithDeadline(context.WithoutCancel(parent), deadline)
	defer cancel()
	// Once the execution is cancelled, the read-back ends 2 s after it began
	// (a dial into a cut link included).
	defer context.AfterFunc(parent, func() {
		time.AfterFunc(max(time.Until(start.Add(2*time.Second)), 0), cancel)
	})()
	delay := 50 * time.Millisecond
	var last error
	for {
		w.S.Discard()
		conn, err := w.S.Conn(ctx)
		if err == nil {
			var ckpt, outbox bool
			err = conn.QueryRow(ctx, w.P.SQL.ReadBack, wr.Lease.RunID, wr.ExpectedRevision+1, wr.EventID).Scan(&ckpt, &outbox)
			if err == nil {
				switch {
				case ckpt && outbox:
					// Committed on this primary; where commits wait for a
					// synchronous standby the lost answer may have been that
					// wait's (its backend ended in it): durability is not known.
					var waits bool
					if err := conn.QueryRow(ctx, commitsWaitForStandby).Scan(&waits); err != nil || waits {
						return nil, newErr("CommitOutcomeUnknown", "durability_unconfirmed",
							"run %s: event %s committed on the primary; whether the synchronous standby has it is not known",
							wr.Lease.RunID, wr.EventID)
					}
					var status string
					_ = conn.QueryRow(ctx, `SELECT status FROM agent_runs WHERE run_id = $1`, wr.Lease.RunID).Scan(&status)
					return &Written{Revision: wr.ExpectedRevision + 1, Status: status, EventID: wr.EventID, ReadBack: true}, nil
				case !ckpt && !outbox:
					return nil, nil
				}
				return nil, newErr("CommitInconsistent", "inconsistent",
					"run %s: checkpoint and outbox row of event %s disagree", wr.Lease.RunID, wr.EventID)
			}
		}
		last = err
		if ctx.Err() != nil || time.Now().Add(delay).After(deadline) {
			return nil, newErr("CommitOutcomeUnknown", "readback", "read-back impossible: %v", last)
		}
		time.Sleep(delay)
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// warningIsUnknown: a COMMIT answered with a WARNING (the cancelled wait for
// synchronous replication: committed locally, maybe not on the standby) is
// outcome unknown, never durable. Any WARNING counts: its SQLSTATE (01000)
// does not tell them apart and message text is never matched.
func warningIsUnknown(notices []*pgconn.Notice) error {
	return newErr("CommitOutcomeUnknown", "durability_unconfirmed",
		"commit acknowledged with a warning (%s): committed locally, durability unconfirmed", notices[0].Message)
}

// String for logs.
func (wr *Write) String() string {
	return fmt.Sprintf("%s run=%s epoch=%d rev=%d event=%s", wr.Transition, wr.Lease.RunID, wr.Lease.Epoch, wr.ExpectedRevision, wr.EventID)
}

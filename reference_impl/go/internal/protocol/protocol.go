package protocol

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"fencecheck/goworker/internal/tool"
)

// Protocol is the strategy object: the statements plus the few Go-side
// decisions a mutant may replace. Correct code never asks which mutant is
// on; a mutant (internal/mutants) is a Protocol with exactly one field
// changed. Every field is used in exactly one place.
type Protocol struct {
	Name string
	SQL  Statements
	// OperationID derives an intent's identity (rule 5).
	OperationID func(tenant, runID, step string, effectVersion int) string
	// RenewConfirmed decides from the renewal's command tag whether the lease
	// was extended (Leases.Renew): exactly one row.
	RenewConfirmed func(tag pgconn.CommandTag) bool
	// CheckLease is the validation after the lease row lock (Writer.lock).
	CheckLease func(runID string, holder, live bool) error
	// LockInOwnTx runs lock + validation in a transaction of its own,
	// committed before the write's (only a mutant sets it).
	LockInOwnTx bool
	// ConsumerPastBeforeApply moves the consumer's read position past each
	// message before applying it (only a mutant sets it; this worker did so
	// until L[apply_fails] showed a failed apply losing its message).
	ConsumerPastBeforeApply bool
	// ConvergeApart writes the reconciler's convergence and the paused run's
	// return to the queue as two statements, each committed alone.
	ConvergeApart bool
	// ResendWithoutDeadline leaves a same-key resend's claim without its
	// local deadline, so Send never checks it (only a mutant sets it).
	ResendWithoutDeadline bool
	// DeadlineFromAnswer counts a dispatch claim's local deadline from the
	// claim's answer instead of from when it was sent (only a mutant sets it).
	DeadlineFromAnswer bool
	// ResendDeadlineFromAnswer does the same for a same-key resend's claim
	// (only a mutant sets it).
	ResendDeadlineFromAnswer bool
	// OnRenewUnconfirmed is what the heartbeat does with an unconfirmed
	// renewal: cancel the execution with its cause (rule 8).
	OnRenewUnconfirmed func(cancel context.CancelCauseFunc, cause error)
	// RenewBound is the client-side bound of one renewal call, from the
	// configured heartbeat timeout: the renewal's answer counts only within
	// it (rule 8; S: a black hole, a SyncRep wait, a late answer).
	RenewBound func(configured time.Duration) time.Duration
	// WithoutResult is the ledger status of a tool answer that records no
	// result (Dispatcher.SettleWithoutResult): prepared only on the tool's
	// proof it did not act (429, refused connection), else unknown (rule 5).
	WithoutResult func(a tool.Answer) string
	// ResolveUnknown decides a write whose COMMIT outcome is unknown
	// (Writer.Write): read back by event_id (rule 9).
	ResolveUnknown func(ctx context.Context, w *Writer, wr *Write) (*Written, error)
	// CommitWarning judges a COMMIT answered with WARNING notices (rule 11).
	CommitWarning func(notices []*pgconn.Notice) error
	// ReconcileWithout decides an unknown operation the tool cannot be asked
	// about (capability none): leave it for a person (rule 5).
	ReconcileWithout func(ctx context.Context, q Querier, r *Reconciler, op UnknownOp) (*Change, error)
	// Decode turns a stored checkpoint into the current version (rule 13).
	Decode func(revision int64, schemaVersion *int32, raw []byte, storedHash []byte) (Checkpoint, error)
	// DurabilityMode judges the replication settings (rule 11).
	DurabilityMode func(level, standbyNames string, standbys int) string
	// Audit writes the operator_actions row of a decision (contract section 7).
	Audit func(ctx context.Context, q Querier, p *Protocol, a AuditRow) (int64, error)
	// Request builds the tool step's request from the checkpoint state and
	// the run's input (an operator's supplement included).
	Request func(state, input map[string]any) map[string]any
	// Backoff is the wait before the next attempt after a transient refusal.
	Backoff func(runID string, attempt int) int64
	// BudgetSpent says the run's attempt budget is used up (pause for a human).
	BudgetSpent func(attempts, maxAttempts int32) bool
	// OnRefusal is the transition after the tool refused for good (4xx).
	OnRefusal string
}

// Correct is the protocol as it must be.
func Correct() *Protocol {
	return &Protocol{
		Name:               "correct",
		SQL:                DefaultStatements(),
		OperationID:        OperationID,
		RenewConfirmed:     func(tag pgconn.CommandTag) bool { return tag.RowsAffected() == 1 },
		CheckLease:         checkLease,
		OnRenewUnconfirmed: func(cancel context.CancelCauseFunc, cause error) { cancel(cause) },
		RenewBound:         func(configured time.Duration) time.Duration { return configured },
		WithoutResult:      withoutResult,
		ResolveUnknown:     readBackResolve,
		CommitWarning:      warningIsUnknown,
		ReconcileWithout:   leaveForPerson,
		Decode:             DecodeCheckpoint,
		DurabilityMode:     durabilityMode,
		Audit:              writeAudit,
		Request:            toolRequest,
		Backoff:            BackoffMS,
		BudgetSpent:        func(attempts, maxAttempts int32) bool { return attempts >= maxAttempts },
		OnRefusal:          "pause_human",
	}
}

// withoutResult: only the tool's proof that it did not act puts an intent
// back to prepared; silence, a reset or a late answer is unknown.
func withoutResult(a tool.Answer) string {
	if a.Kind == "rejected_retryable" {
		return "prepared"
	}
	return "unknown"
}

// toolRequest is the built-in workflow's tool request (worker contract
// section 10): the checkpoint's data, the kind, and what an operator
// supplemented (input.supplement), which makes it a new request.
func toolRequest(state, input map[string]any) map[string]any {
	request := map[string]any{}
	for _, part := range []any{state["data"], map[string]any{"kind": "return_label"}, input["supplement"]} {
		if m, ok := part.(map[string]any); ok {
			for k, v := range m {
				request[k] = v
			}
		}
	}
	return request
}

// checkLease is the English seed's `if !valid { return ErrLeaseLost }`,
// naming which half failed.
func checkLease(runID string, holder, live bool) error {
	if !holder {
		return newErr("LeaseLost", "lost", "lease of run %s lost", runID)
	}
	if !live {
		return newErr("LeaseLost", "expired", "lease of run %s expired", runID)
	}
	return nil
}

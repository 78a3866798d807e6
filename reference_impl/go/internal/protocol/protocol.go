package protocol

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
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
	// OnRenewUnconfirmed is what the heartbeat does with an unconfirmed
	// renewal: cancel the execution with its cause (rule 8).
	OnRenewUnconfirmed func(cancel context.CancelCauseFunc, cause error)
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
		ResolveUnknown:     readBackResolve,
		CommitWarning:      warningIsUnknown,
		ReconcileWithout:   leaveForPerson,
		Decode:             DecodeCheckpoint,
		DurabilityMode:     durabilityMode,
	}
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

package protocol

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Error is a refusal of the protocol. Class is the contract's error
// vocabulary (worker contract sections 4 and 5: LeaseLost, RevisionConflict,
// ...); Reason is a short machine-readable cause (lost, expired, missing).
type Error struct {
	Class  string
	Reason string
	Msg    string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Class
	}
	return e.Msg
}

// Is makes errors.Is(err, ErrLeaseLost) true for every LeaseLost, whatever
// its reason or message (the seeds' sentinel style).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Class == e.Class
}

func newErr(class, reason, format string, args ...any) *Error {
	return &Error{Class: class, Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// Sentinels of the contract's error classes (compare with errors.Is).
var (
	ErrLeaseLost            = &Error{Class: "LeaseLost"}
	ErrRevisionConflict     = &Error{Class: "RevisionConflict"}
	ErrStateConflict        = &Error{Class: "StateConflict"}
	ErrNotClaimable         = &Error{Class: "NotClaimable"}
	ErrRunNotFound          = &Error{Class: "RunNotFound"}
	ErrTaskExists           = &Error{Class: "TaskExists"}
	ErrRunNotRetryable      = &Error{Class: "RunNotRetryable"}
	ErrIntentConflict       = &Error{Class: "IntentConflict"}
	ErrLedgerConflict       = &Error{Class: "LedgerConflict"}
	ErrCommitOutcomeUnknown = &Error{Class: "CommitOutcomeUnknown"}
	ErrCommitInconsistent   = &Error{Class: "CommitInconsistent"}
	ErrSchemaVersionUnknown = &Error{Class: "SchemaVersionUnknown"}
	ErrCheckpointCorrupt    = &Error{Class: "CheckpointCorrupt"}
	ErrExecutionCancelled   = &Error{Class: "ExecutionCancelled"}
	ErrFenceGuard           = &Error{Class: "FenceGuard"}
)

// ClassOf names an error for the history and the ops replies: the protocol
// class, a database error's SQLSTATE class, or the Go type.
func ClassOf(err error) string {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Class
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return "DatabaseError"
	}
	if IsConnectionError(err) {
		return "OperationalError"
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", errors.Unwrap(err)), "*")
}

// ReasonOf is the Reason of a protocol error, or "".
func ReasonOf(err error) string {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Reason
	}
	return ""
}

// FromDatabase maps the database's own refusals (the terminal-state and
// fencing-token guards, 004_fence_guard.sql) to protocol errors by SQLSTATE,
// never by message text; anything else is returned unchanged.
func FromDatabase(err error) error {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return err
	}
	switch pg.Code {
	case "FC004":
		return newErr("StateConflict", "terminal", "%s", pg.Message)
	case "FC012":
		return newErr("FenceGuard", "fence", "%s (%s)", pg.Message, pg.Detail)
	}
	return err
}

// SQLState is the SQLSTATE of a server error, or "".
func SQLState(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

// IsConnectionError: no server verdict came back (a broken or closed
// connection, a timeout), or the server answered with class 08 (connection)
// or 57 (operator intervention, except 57014 query canceled).
func IsConnectionError(err error) bool {
	if err == nil {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return strings.HasPrefix(pg.Code, "08") || (strings.HasPrefix(pg.Code, "57") && pg.Code != "57014")
	}
	var pe *Error
	return !errors.As(err, &pe)
}

// IsRetryableConflict: 40001 / 40P01, the transaction did not commit; retry it whole.
func IsRetryableConflict(err error) bool {
	s := SQLState(err)
	return s == "40001" || s == "40P01"
}

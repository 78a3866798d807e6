package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The operator's decisions (worker contract section 7; Chinese seed
// sections 3.1, 10, 12): cancel, resolve an operation in doubt, decide a
// run paused for a human, converge an operation by hand. Each runs in one
// transaction of a session of the operator group, holds the run's row lock
// (a racing takeover waits for it), moves the run only along the state
// table, and writes one operator_actions row in the same transaction.

// AuditRow is one operator decision as operator_actions keeps it.
type AuditRow struct {
	RunID, OperationID *string
	Action, Reason     string
	Ticket             *string
	Before             []byte
}

// moves is the control plane's half of the state table: (decision, from) -> to.
var moves = map[[2]string]string{
	{"cancel", "queued"}: "cancelled", {"cancel", "running"}: "cancelled",
	{"cancel", "waiting_tool"}: "cancelled", {"cancel", "paused_indoubt"}: "cancelled",
	{"cancel", "paused_human"}:    "cancelled",
	{"resolve", "paused_indoubt"}: "queued",
	{"approve", "paused_human"}:   "queued", {"supplement", "paused_human"}: "queued",
	{"terminate", "paused_human"}: "failed", {"terminate", "paused_indoubt"}: "failed",
}

func isTerminal(status string) bool {
	return status == "succeeded" || status == "failed" || status == "cancelled"
}

// writeAudit is the correct Protocol.Audit: the row, with the run as it is now.
func writeAudit(ctx context.Context, q Querier, p *Protocol, a AuditRow) (int64, error) {
	if strings.TrimSpace(a.Reason) == "" {
		return 0, newErr("BadRequest", "reason", "an operator decision needs a reason")
	}
	after, err := p.snapshot(ctx, q, a.RunID, a.OperationID)
	if err != nil {
		return 0, err
	}
	var id int64
	err = q.QueryRow(ctx, p.SQL.Audit, a.RunID, a.OperationID, a.Action, a.Reason, a.Ticket,
		nullJSON(a.Before), nullJSON(after)).Scan(&id)
	return id, err
}

func nullJSON(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

func (p *Protocol) snapshot(ctx context.Context, q Querier, runID, opID *string) ([]byte, error) {
	if runID == nil {
		return nil, nil
	}
	var snap []byte
	err := q.QueryRow(ctx, p.SQL.RunSnapshot, *runID, opID).Scan(&snap)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return snap, err
}

// lockRun takes the run's row lock: its status and tenant, or RunNotFound.
func (p *Protocol) lockRun(ctx context.Context, tx pgx.Tx, runID string) (string, string, error) {
	var status, tenant string
	var epoch, revision int64
	err := tx.QueryRow(ctx, p.SQL.LockRun, runID).Scan(&status, &tenant, &epoch, &revision)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", newErr("RunNotFound", "missing", "run %s not found", runID)
	}
	return status, tenant, err
}

// move is one control-plane move of the run (locked by the caller) with its
// outbox event; supplement (sealed already) joins the input.
//
// A run its task's retry superseded is never queued again (contract
// section 5, retry_run and decide): a resolve that would queue it ends it
// cancelled; an approve or a supplement, which ask it to go on, are refused.
func (p *Protocol) move(ctx context.Context, tx pgx.Tx, runID, tenant, decision, from, reason string,
	supplement []byte) (string, error) {
	to, ok := moves[[2]string{decision, from}]
	if !ok {
		return "", newErr("StateConflict", "transition", "run %s is %s: %s is not allowed", runID, from, decision)
	}
	if to == "queued" {
		var active *string
		if err := tx.QueryRow(ctx, p.SQL.ActiveRunOfTask, runID).Scan(&active); err != nil {
			return "", err
		}
		if active == nil || *active != runID {
			if decision != "resolve" {
				return "", newErr("StateConflict", "superseded",
					"run %s was superseded by a retry of its task: %s the task's active run instead", runID, decision)
			}
			to, reason = "cancelled", supersededReason(active, decision+": "+reason)
		}
	}
	if err := ledgerChange(ctx, tx, p.SQL.OperatorMove, runID, decision,
		runID, to, reason, from, nullJSON(supplement)); err != nil {
		return "", err
	}
	_, err := tx.Exec(ctx, p.SQL.MoveEvent, runID, tenant, "agent."+decision, from, to, reason)
	return to, err
}

// Cancel (English seed section 9.3): the run becomes cancelled and gives up
// its lease; prepared operations are forbidden; dispatching and unknown ones
// stay as they are: they may have happened. Audited.
func (p *Protocol) Cancel(ctx context.Context, db DB, runID, reason string, ticket *string) (map[string]any, error) {
	out := map[string]any{}
	err := pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		status, tenant, err := p.lockRun(ctx, tx, runID)
		if err != nil {
			return err
		}
		before, err := p.snapshot(ctx, tx, &runID, nil)
		if err != nil {
			return err
		}
		if !isTerminal(status) {
			if status, err = p.move(ctx, tx, runID, tenant, "cancel", status, reason, nil); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, p.SQL.CancelPrepared, runID); err != nil {
				return err
			}
		}
		ops, err := collectOps(ctx, tx, p.SQL.OpsOfRun, runID)
		if err != nil {
			return err
		}
		id, err := p.Audit(ctx, tx, p, AuditRow{RunID: &runID, Action: "cancel", Reason: reason, Ticket: ticket, Before: before})
		out["run_status"], out["operations"], out["audit_id"] = status, ops, id
		return err
	})
	return out, FromDatabase(err)
}

// Resolve records a person's finding on an operation in doubt (executed,
// with the remote id found, or not_executed): the operation converges
// (succeeded, or failed_final with executed=false) and the run paused in
// doubt goes back to the queue once nothing else of it is in doubt; a worker
// then continues from the ledger.
// afterLock runs while the run's row lock is held, before anything is
// decided (the injection point after_operator_lock).
func (p *Protocol) Resolve(ctx context.Context, db DB, runID, opID, decision string, remoteID *string,
	reason string, ticket *string, afterLock func()) (map[string]any, error) {
	out := map[string]any{}
	err := pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		status, tenant, err := p.lockRun(ctx, tx, runID)
		if err != nil {
			return err
		}
		afterLock()
		if decision != "executed" && decision != "not_executed" || (decision == "executed" && !namesResource(remoteID)) {
			return newErr("BadRequest", "decision", "decision is executed (with the remote id) or not_executed")
		}
		var opRun, opStatus string
		err = tx.QueryRow(ctx, p.SQL.LockOperation, opID).Scan(&opRun, &opStatus)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && opRun != runID) {
			return newErr("RunNotFound", "missing", "run %s has no operation %s", runID, opID)
		}
		if err != nil {
			return err
		}
		if status != "paused_indoubt" || (opStatus != "unknown" && opStatus != "dispatching") {
			return newErr("StateConflict", "not_in_doubt", "run %s is %s, operation %s is %s: nothing in doubt to resolve",
				runID, status, opID, opStatus)
		}
		// Under a live dispatch claim the request may be on its way: no finding
		// yet (as ConvergeOperation); one whose claim ran out is in doubt.
		var claimLive bool
		if err := tx.QueryRow(ctx, p.SQL.ClaimLive, opID).Scan(&claimLive); err != nil {
			return err
		}
		if claimLive {
			return newErr("StateConflict", "claim_live", "operation %s is dispatching under a live claim: "+
				"its request may be on its way", opID)
		}
		before, err := p.snapshot(ctx, tx, &runID, &opID)
		if err != nil {
			return err
		}
		outcome := map[string]string{"executed": "succeeded", "not_executed": "failed_final"}[decision]
		if err := ledgerChange(ctx, tx, p.SQL.ResolveOperation, opID, "resolve",
			opID, runID, outcome, remoteID, "operator_resolved", reason, ticket); err != nil {
			return err
		}
		// The finding is recorded either way; the run goes back to the queue
		// only when nothing else of it is in doubt (a second operation unknown
		// would make it claimable with an effect in doubt).
		var left bool
		if err := tx.QueryRow(ctx, p.SQL.InDoubtLeft, runID).Scan(&left); err != nil {
			return err
		}
		to := status
		if !left {
			if to, err = p.move(ctx, tx, runID, tenant, "resolve", status, reason, nil); err != nil {
				return err
			}
		}
		id, err := p.Audit(ctx, tx, p, AuditRow{RunID: &runID, OperationID: &opID, Action: "resolve:" + decision,
			Reason: reason, Ticket: ticket, Before: before})
		out["run_status"], out["operation_status"], out["audit_id"] = to, outcome, id
		return err
	})
	return out, FromDatabase(err)
}

// Decide is a person's decision on a run paused for a human: approve
// (continue as planned; a run whose attempt budget ran out gets one more
// attempt), supplement (continue with the supplied fields, kept in
// input.supplement: the next request differs, so the worker plans the
// effect under a new effect_version) or terminate (failed; prepared
// operations are cancelled; terminate also ends a run paused in doubt,
// whose operation in doubt stays as it is).
func (p *Protocol) Decide(ctx context.Context, db DB, runID, decision string, supplement []byte,
	reason string, ticket *string) (map[string]any, error) {
	if decision != "approve" && decision != "supplement" && decision != "terminate" ||
		(decision == "supplement") != (supplement != nil) {
		return nil, newErr("BadRequest", "decision", "decision is approve, supplement (with an object) or terminate")
	}
	out := map[string]any{}
	err := pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		status, tenant, err := p.lockRun(ctx, tx, runID)
		if err != nil {
			return err
		}
		before, err := p.snapshot(ctx, tx, &runID, nil)
		if err != nil {
			return err
		}
		to, err := p.move(ctx, tx, runID, tenant, decision, status, reason, supplement)
		if err != nil {
			return err
		}
		if to == "failed" {
			if _, err := tx.Exec(ctx, p.SQL.CancelPrepared, runID); err != nil {
				return err
			}
		}
		id, err := p.Audit(ctx, tx, p, AuditRow{RunID: &runID, Action: decision, Reason: reason, Ticket: ticket, Before: before})
		out["run_status"], out["audit_id"] = to, id
		return err
	})
	return out, FromDatabase(err)
}

// ConvergeOperation is a manual convergence of an unknown operation to a
// fact a person established (the tool's console): the ledger records it;
// a run paused in doubt with nothing else in doubt goes back to the queue,
// as the reconciler's convergence does (else nothing would ever resume it:
// Resolve refuses an operation no longer unknown).
func (p *Protocol) ConvergeOperation(ctx context.Context, db DB, opID, outcome string, remoteID *string,
	reason string, ticket *string) (map[string]any, error) {
	if outcome != "succeeded" && outcome != "failed_final" || (outcome == "succeeded" && !namesResource(remoteID)) {
		return nil, newErr("BadRequest", "outcome", "outcome is succeeded (with the remote id) or failed_final")
	}
	out := map[string]any{}
	err := pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		var runID, status string
		err := tx.QueryRow(ctx, p.SQL.LockOperation, opID).Scan(&runID, &status)
		if errors.Is(err, pgx.ErrNoRows) {
			return newErr("RunNotFound", "missing", "operation %s not found", opID)
		}
		if err != nil {
			return err
		}
		if status != "unknown" {
			return newErr("StateConflict", "not_unknown", "operation %s is %s: only unknown converges", opID, status)
		}
		before, err := p.snapshot(ctx, tx, &runID, &opID)
		if err != nil {
			return err
		}
		if err := ledgerChange(ctx, tx, p.SQL.ResolveOperation, opID, "converge",
			opID, runID, outcome, remoteID, "operator_converged", reason, ticket); err != nil {
			return err
		}
		if err := p.resumeRun(ctx, tx, opID); err != nil {
			return err
		}
		id, err := p.Audit(ctx, tx, p, AuditRow{RunID: &runID, OperationID: &opID, Action: "converge",
			Reason: reason, Ticket: ticket, Before: before})
		out["operation_status"], out["audit_id"] = outcome, id
		return err
	})
	return out, FromDatabase(err)
}

// Paused lists the runs paused in doubt or for a human, with their
// operations and the evidence kept on them.
func (p *Protocol) Paused(ctx context.Context, q Querier) (any, error) {
	return queryJSON(ctx, q, p.SQL.PausedRuns)
}

// Actions is the audit trail of the operator's decisions on one run.
func (p *Protocol) Actions(ctx context.Context, q Querier, runID string) (any, error) {
	return queryJSON(ctx, q, p.SQL.OperatorActions, runID)
}

func queryJSON(ctx context.Context, q Querier, sql string, args ...any) (any, error) {
	var raw []byte
	if err := q.QueryRow(ctx, sql, args...).Scan(&raw); err != nil {
		return nil, err
	}
	var v any
	return v, json.Unmarshal(raw, &v)
}

// namesResource: a person's finding that the tool acted names the resource
// it made; a missing or blank remote id is refused, or the operation would
// be succeeded naming nothing (blind hunt 71's reader).
func namesResource(remoteID *string) bool {
	return remoteID != nil && strings.TrimSpace(*remoteID) != ""
}

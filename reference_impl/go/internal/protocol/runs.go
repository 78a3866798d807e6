package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Control plane of runs (rules 6, 7): run by a session of the operator
// group (worker contract section 7); a worker-group session is refused by
// the database (grants, and the guard of 008_protocol_guard.sql).

// CreateRun creates a task with its first run (queued) in one short
// transaction, active_run_id set there too (English seed section 4).
func (p *Protocol) CreateRun(ctx context.Context, db DB, tenant, taskID string, input any, maxAttempts int) (string, error) {
	runID := NewUUID()
	in, err := json.Marshal(input)
	if err != nil {
		return "", err
	}
	err = pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, p.SQL.CreateTenant, tenant); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, p.SQL.CreateTask, tenant, taskID, runID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return newErr("TaskExists", "exists", "task %s exists; use retry_run", taskID)
		}
		_, err = tx.Exec(ctx, p.SQL.CreateRun, runID, tenant, taskID, string(in), maxAttempts)
		return err
	})
	return runID, err
}

// RetryRun: a retry is a new run_id under the same task; active_run_id
// switches in the same transaction; the old run stays exactly as it is.
func (p *Protocol) RetryRun(ctx context.Context, db DB, taskID string) (string, string, error) {
	runID := NewUUID()
	var old string
	err := pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		var tenant string
		var active *string
		err := tx.QueryRow(ctx, p.SQL.LockTask, taskID).Scan(&tenant, &active)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && active == nil) {
			return newErr("RunNotFound", "missing", "task %s not found", taskID)
		}
		if err != nil {
			return err
		}
		old = *active
		var status string
		var input []byte
		var maxAttempts int32
		if err := tx.QueryRow(ctx, p.SQL.ActiveRun, old).Scan(&status, &input, &maxAttempts); err != nil {
			return err
		}
		if status == "queued" || status == "running" || status == "waiting_tool" {
			return newErr("RunNotRetryable", "live", "run %s of task %s is still %s; cancel it first", old, taskID, status)
		}
		if _, err := tx.Exec(ctx, p.SQL.InsertRetryRun, runID, tenant, taskID, string(input), maxAttempts, old); err != nil {
			return err
		}
		return ledgerChange(ctx, tx, p.SQL.SwitchTask, taskID, "task", tenant, taskID, runID)
	})
	return runID, old, FromDatabase(err)
}

func collectOps(ctx context.Context, q Querier, sql, runID string) ([]map[string]any, error) {
	rows, err := q.Query(ctx, sql, runID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	ops := []map[string]any{}
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			return nil, err
		}
		ops = append(ops, map[string]any{"operation_id": id, "status": status})
	}
	return ops, rows.Err()
}

// DeliverCallback accepts a tool callback only for an operation of the run
// it names, while that run is its task's active, live run; anything else is
// kept as evidence and refused (rule 7): a late answer of an old run never
// moves a newer one.
func (p *Protocol) DeliverCallback(ctx context.Context, db DB, runID, opID string, payload map[string]any) (bool, error) {
	accepted := false
	body, err := json.Marshal(payload)
	if err != nil {
		return false, err
	}
	err = pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		var opRun, status string
		err := tx.QueryRow(ctx, p.SQL.LockOperation, opID).Scan(&opRun, &status)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		var live bool
		if err := tx.QueryRow(ctx, p.SQL.CallbackLive, runID).Scan(&live); err != nil {
			return err
		}
		// The resource the callback names: resource_id, else remote_id; a
		// blank one names none (as Python's migration 022: a whitespace id
		// converged the operation here and not there, blind hunt 68's reader).
		remote, named := payload["resource_id"].(string)
		if !named {
			remote, _ = payload["remote_id"].(string)
		}
		if opRun != runID || !live || (status != "dispatching" && status != "unknown") ||
			strings.TrimSpace(remote) == "" {
			_, err := tx.Exec(ctx, p.SQL.CallbackRefuse, opID, runID, string(body))
			return err
		}
		accepted = true
		return ledgerChange(ctx, tx, p.SQL.CallbackAccept, opID, "callback", opID, remote, string(body))
	})
	return accepted, err
}

// RunRow is the run row as the worker role sees it (tenant-scoped).
type RunRow struct {
	RunID, TaskID, Status      string
	Revision, Epoch            int64
	Owner, CurrentStep, Reason *string
	LeaseExpiresAt             *time.Time
	SchemaVersion              *int32
	Attempts, MaxAttempts      int32
	Input                      map[string]any
	LeaseLive                  bool
}

// RunState reads one run; RunNotFound when this tenant cannot see it.
func (p *Protocol) RunState(ctx context.Context, q Querier, runID string) (*RunRow, error) {
	r := new(RunRow)
	var input []byte
	err := q.QueryRow(ctx, p.SQL.RunState, runID).Scan(&r.RunID, &r.TaskID, &r.Status, &r.Revision, &r.Owner,
		&r.Epoch, &r.LeaseExpiresAt, &r.CurrentStep, &r.SchemaVersion, &r.Attempts, &r.MaxAttempts, &input,
		&r.Reason, &r.LeaseLive)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, newErr("RunNotFound", "missing", "run %s not found", runID)
	}
	if err != nil {
		return nil, err
	}
	v, err := Decode(input)
	if m, ok := v.(map[string]any); ok {
		r.Input = m
	} else {
		r.Input = map[string]any{}
	}
	return r, err
}

// LatestState is the state of the checkpoint at the run's revision, as
// stored (not migrated); nil before the first protected write.
func (p *Protocol) LatestState(ctx context.Context, q Querier, runID string) (map[string]any, error) {
	var revision int64
	var version *int32
	var state, hash []byte
	err := q.QueryRow(ctx, p.SQL.LatestCheckpoint, runID).Scan(&revision, &version, &state, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	v, err := Decode(state)
	m, _ := v.(map[string]any)
	return m, err
}

// ReadCheckpoint is the checkpoint at the run's revision, decoded (or
// refused) per rule 13; nil before the first protected write.
func (p *Protocol) ReadCheckpoint(ctx context.Context, q Querier, runID string) (*Checkpoint, error) {
	if _, err := p.RunState(ctx, q, runID); err != nil {
		return nil, err
	}
	var revision int64
	var version *int32
	var state, hash []byte
	err := q.QueryRow(ctx, p.SQL.LatestCheckpoint, runID).Scan(&revision, &version, &state, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ck, err := p.Decode(revision, version, state, hash)
	if err != nil {
		return nil, err
	}
	return &ck, nil
}

package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Purge is retention (worker contract section 5, the optional op purge;
// Chinese seed section 12): up to limit tasks of the session's tenant, the
// oldest first, whose every run is terminal and untouched for olderThanMS,
// with no operation prepared, dispatching or unknown and every outbox row
// published, are archived, then deleted, with every run, checkpoint,
// ledger row and outbox row; one operator_actions row records the purge.
//
// Invariant: nothing is deleted that is not first in the archive file,
// synced to disk. All of it is one transaction: the pick (its task rows
// locked, SKIP LOCKED), the database's guarded deletion of each task
// (Statements.PurgeTask), which answers the rows it deleted, and the audit
// row; the archive (when archive is not "") is appended and fsynced before
// that transaction commits, and a failure before the COMMIT rolls the
// deletion back. The archive may then hold tasks that were not deleted,
// never the other way round.
func (p *Protocol) Purge(ctx context.Context, db DB, olderThanMS, limit int64, reason string, ticket *string,
	archive string) (map[string]any, error) {
	if olderThanMS < 0 || limit < 1 {
		return nil, newErr("BadRequest", "arguments", "purge needs older_than_ms >= 0 and limit >= 1")
	}
	if strings.TrimSpace(reason) == "" {
		return nil, newErr("BadRequest", "reason", "an operator decision needs a reason")
	}
	purged := []string{}
	err := pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		purged = purged[:0]
		picked, err := pickTasks(ctx, tx, p.SQL.PurgeCandidates, olderThanMS, limit)
		if err != nil {
			return err
		}
		var docs [][]byte
		for _, task := range picked {
			var doc []byte
			if err := tx.QueryRow(ctx, p.SQL.PurgeTask, task, olderThanMS).Scan(&doc); err != nil {
				return err
			}
			if doc == nil {
				continue // judged not purgeable under its locks: nothing deleted
			}
			docs = append(docs, doc)
			purged = append(purged, task)
		}
		before, err := json.Marshal(map[string]any{"tasks": len(purged), "older_than_ms": olderThanMS})
		if err != nil {
			return err
		}
		if _, err := p.Audit(ctx, tx, p, AuditRow{Action: "purge", Reason: reason, Ticket: ticket, Before: before}); err != nil {
			return err
		}
		if archive != "" && len(docs) > 0 {
			return appendArchive(archive, docs)
		}
		return nil
	})
	if err != nil {
		return nil, FromDatabase(err)
	}
	out := map[string]any{"purged_tasks": purged, "archive": nil}
	if archive != "" {
		out["archive"] = archive
	}
	return out, nil
}

func pickTasks(ctx context.Context, tx pgx.Tx, sql string, olderThanMS, limit int64) ([]string, error) {
	rows, err := tx.Query(ctx, sql, olderThanMS, limit)
	if err != nil {
		return nil, err
	}
	tasks, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return tasks, err
}

// appendArchive appends one JSON line per document and syncs the file (and
// its directory, when the file is new) before returning.
func appendArchive(path string, docs [][]byte) error {
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, os.ErrNotExist)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	var buf []byte
	for _, d := range docs {
		buf = append(append(buf, d...), '\n')
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if created {
		dir, err := os.Open(filepath.Dir(path))
		if err != nil {
			return err
		}
		defer dir.Close()
		return dir.Sync()
	}
	return nil
}

// Package schema creates this worker's tables, roles, row level security and
// the fencing-token guard (sql/*.sql, embedded in the binary): its own DDL
// mirroring worker contract section 6, never the Python implementation's
// migrations or functions.
package schema

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
)

//go:embed sql/*.sql
var files embed.FS

// Overlay is a mutant's change to the database (a DDL statement run after
// the migrations, never recorded as one).
type Overlay struct {
	Name string
	SQL  string
}

// Migration is one embedded file with its checksum.
type Migration struct {
	Name     string
	SQL      string
	Checksum string
}

// Migrations returns the embedded files in name order.
func Migrations() ([]Migration, error) {
	entries, err := files.ReadDir("sql")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		body, err := files.ReadFile("sql/" + e.Name())
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(body)
		out = append(out, Migration{e.Name(), string(body), hex.EncodeToString(sum[:])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

const ledgerDDL = `CREATE TABLE IF NOT EXISTS public.fencecheck_go_migrations (
  name text PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`

// Migrate applies every migration not yet applied to the database at
// adminDSN, each in its own transaction, under a per-database advisory lock
// (so two migrate runs of one database serialise and the second does
// nothing), then the overlays. Invariant: a file applied once is never applied
// again, and a changed file is refused rather than silently skipped.
func Migrate(ctx context.Context, adminDSN string, overlays []Overlay) ([]string, error) {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext('fencecheck_go_migrate'))`); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, ledgerDDL); err != nil {
		return nil, err
	}
	migrations, err := Migrations()
	if err != nil {
		return nil, err
	}
	var applied []string
	for _, m := range migrations {
		var sum string
		err := conn.QueryRow(ctx, `SELECT checksum FROM public.fencecheck_go_migrations WHERE name = $1`, m.Name).Scan(&sum)
		if err == nil {
			if sum != m.Checksum {
				return applied, fmt.Errorf("migration %s changed after it was applied; write a new migration", m.Name)
			}
			continue
		}
		if err != pgx.ErrNoRows {
			return applied, err
		}
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
			_, err := tx.Exec(ctx, `INSERT INTO public.fencecheck_go_migrations (name, checksum) VALUES ($1, $2)`, m.Name, m.Checksum)
			return err
		}); err != nil {
			return applied, err
		}
		applied = append(applied, m.Name)
	}
	for _, o := range overlays {
		if _, err := conn.Exec(ctx, o.SQL); err != nil {
			return applied, fmt.Errorf("overlay %s: %w", o.Name, err)
		}
		applied = append(applied, "overlay:"+o.Name)
	}
	return applied, nil
}

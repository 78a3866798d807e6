// Package pgtest gives the Go tests a real PostgreSQL: $FENCECHECK_GO_TEST_DSN
// (a superuser DSN) when set, else a throwaway cluster started with the
// harness's own binaries and driver (scripts/pg_for_tests.py), stopped when
// the test binary exits. Each test gets a freshly migrated database.
package pgtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"fencecheck/goworker/internal/schema"
)

var (
	once     sync.Once
	adminDSN string
	startErr error
	stdin    io.WriteCloser
	counter  atomic.Int64
)

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

func start() {
	if dsn := os.Getenv("FENCECHECK_GO_TEST_DSN"); dsn != "" {
		adminDSN = dsn
		return
	}
	root := moduleRoot()
	python := filepath.Join(root, "..", "..", ".venv", "bin", "python")
	if _, err := os.Stat(python); err != nil {
		python = "python3"
	}
	cmd := exec.Command(python, filepath.Join(root, "scripts", "pg_for_tests.py"))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err == nil {
		stdin, err = cmd.StdinPipe()
	}
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		startErr = err
		return
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case adminDSN = <-line:
		if adminDSN == "" {
			startErr = fmt.Errorf("scripts/pg_for_tests.py printed no DSN (see stderr)")
		}
	case <-time.After(60 * time.Second):
		startErr = fmt.Errorf("scripts/pg_for_tests.py gave no DSN within 60 s")
		_ = cmd.Process.Kill()
	}
}

// Stop ends the throwaway cluster (call from TestMain after m.Run).
func Stop() {
	if stdin != nil {
		_ = stdin.Close()
		time.Sleep(500 * time.Millisecond) // let it stop the server; its pdeathsig covers the rest
	}
}

// DB is one migrated database: its superuser DSN, and login roles made on
// demand (contract section 7).
type DB struct {
	Admin      string
	name, host string
	port       uint16
}

// Login is the DSN of a login role of group (fencecheck_worker or
// fencecheck_operator) bound to tenant in this database, made on first
// use and dropped when the test ends (roles are cluster-wide).
func (d DB) Login(t *testing.T, group, tenant string) string {
	t.Helper()
	role := fmt.Sprintf("%s_%s_%s", d.name, strings.TrimPrefix(group, "fencecheck_"), tenant[:8])
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, d.Admin)
	if err != nil {
		t.Fatalf("connect %s: %v", d.Admin, err)
	}
	defer admin.Close(ctx)
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if !exists {
		if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN IN ROLE %s", role, group)); err != nil {
			t.Fatalf("create role: %v", err)
		}
		if _, err := admin.Exec(ctx, `INSERT INTO public.tenant_bindings (role_name, tenant_id) VALUES ($1, $2)`,
			role, tenant); err != nil {
			t.Fatalf("bind role: %v", err)
		}
		t.Cleanup(func() {
			if c, err := pgx.Connect(ctx, adminDSN); err == nil {
				_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+d.name+" WITH (FORCE)")
				_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+role)
				c.Close(ctx)
			}
		})
	}
	return fmt.Sprintf("host=%s port=%d dbname=%s user=%s", d.host, d.port, d.name, role)
}

// Fresh creates and migrates a database of its own for one test.
func Fresh(t *testing.T, overlays ...schema.Overlay) DB {
	t.Helper()
	once.Do(start)
	if startErr != nil {
		t.Fatalf("no PostgreSQL for the tests: %v (set FENCECHECK_GO_TEST_DSN or run `make setup`)", startErr)
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Fatalf("connect %s: %v", adminDSN, err)
	}
	defer admin.Close(ctx)
	name := fmt.Sprintf("gotest_%d_%d", os.Getpid(), counter.Add(1))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	cfg, _ := pgx.ParseConfig(adminDSN)
	host, port := cfg.Host, cfg.Port
	db := DB{Admin: fmt.Sprintf("host=%s port=%d dbname=%s user=%s", host, port, name, cfg.User),
		name: name, host: host, port: port}
	if _, err := schema.Migrate(ctx, db.Admin, overlays); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, adminDSN)
		if err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
			c.Close(ctx)
		}
	})
	return db
}

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

// DB is one migrated database: its superuser DSN and a worker-role DSN.
type DB struct {
	Admin, Worker string
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
	db := DB{
		Admin:  fmt.Sprintf("host=%s port=%d dbname=%s user=%s", host, port, name, cfg.User),
		Worker: fmt.Sprintf("host=%s port=%d dbname=%s user=fencecheck_worker", host, port, name),
	}
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

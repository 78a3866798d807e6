package worker

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"fencecheck/goworker/internal/protocol"
)

// Bench times n operations of one kind on one connection (connection time
// excluded, like pgbench's "without initial connection time"), after an
// untimed warm-up that prepares every statement. checkpoint and renew work
// on the lease given; claim claims n due runs of the settings' tenant and
// requires every claim to be granted. Outside the harness: no injection
// point and no history line costs anything.
func Bench(rt *Runtime, op string, n int, lease protocol.Lease) (time.Duration, error) {
	ctx := context.Background()
	conn, err := rt.Main.Conn(ctx)
	if err != nil {
		return 0, err
	}
	var one func() error
	switch op {
	case "checkpoint":
		st, err := rt.P.RunState(ctx, conn, lease.RunID)
		if err != nil {
			return 0, err
		}
		rev := st.Revision
		state := map[string]any{"step": "x"}
		payload := map[string]any{"tenant_id": rt.S.Tenant, "run_id": lease.RunID}
		one = func() error {
			out, err := rt.Writer.Write(ctx, &protocol.Write{Lease: lease, ExpectedRevision: rev, Transition: "checkpoint",
				State: state, SchemaVersion: 2, EventType: "agent.checkpoint", Payload: payload})
			if err == nil {
				rev = out.Revision
			}
			return err
		}
	case "renew":
		one = func() error { _, err := rt.P.Renew(ctx, conn, lease, 86400000); return err }
	case "claim":
		one = func() error {
			c, err := rt.P.ClaimRun(ctx, conn, rt.S.Owner(), 86400000)
			if err == nil && c == nil {
				err = fmt.Errorf("claim granted nothing: the queue ran dry")
			}
			return err
		}
	default:
		return 0, fmt.Errorf("bench: unknown operation %q (checkpoint, renew, claim)", op)
	}
	warm := 20
	if op == "claim" {
		warm = 0 // every claim uses up a queued run; the driver queues exactly n
	}
	for i := 0; i < warm; i++ {
		if err := one(); err != nil {
			return 0, err
		}
	}
	started := time.Now()
	for i := 0; i < n; i++ {
		if err := one(); err != nil {
			return 0, fmt.Errorf("%s %d of %d: %w", op, i+1, n, err)
		}
	}
	return time.Since(started), nil
}

var param = regexp.MustCompile(`\$(\d+)`)

// pgbenchSQL renders one of the worker's statements as a pgbench command:
// $n becomes names[n-1] (a :variable or SQL text).
func pgbenchSQL(statement string, names ...string) string {
	s := param.ReplaceAllStringFunc(statement, func(m string) string {
		var i int
		fmt.Sscan(m[1:], &i)
		return names[i-1]
	})
	return strings.TrimRight(s, "; \n") + ";\n"
}

// BenchScripts are the worker's own statements as pgbench scripts, so that
// pgbench runs exactly what the Go code runs (minus the Go code): the
// checkpoint's seven round trips, renew, claim. pgbench carries the
// revision from one statement to the next with \gset.
func BenchScripts(p *protocol.Protocol) map[string]string {
	state := `'{"step":"x"}'`
	validate := strings.TrimRight(pgbenchSQL(p.SQL.ValidateLease, ":run_id", ":owner", ":epoch"), ";\n") + ` \gset` + "\n"
	cas := strings.TrimRight(pgbenchSQL(p.SQL.CAS, ":run_id", ":revision", "'running'", "false", "NULL", "NULL",
		"NULL", "2"), ";\n") + ` \gset` + "\n"
	return map[string]string{
		"checkpoint": "BEGIN;\n" +
			pgbenchSQL(p.SQL.LockLease, ":run_id") + validate + cas +
			pgbenchSQL(p.SQL.InsertCheckpoint, ":run_id", ":revision", ":tenant_id", ":epoch", ":owner", "'checkpoint'",
				state, "sha256(convert_to("+state+", 'UTF8'))", "2", "gen_random_uuid()") +
			pgbenchSQL(p.SQL.InsertOutbox, "gen_random_uuid()", ":tenant_id", ":run_id", "'agent.checkpoint'",
				`'{"run_id":"x"}'`) +
			"COMMIT;\n",
		"renew": pgbenchSQL(p.SQL.Renew, ":run_id", ":owner", ":epoch", "86400000"),
		"claim": pgbenchSQL(p.SQL.Claim, ":owner", "86400000"),
	}
}

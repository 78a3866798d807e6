package protocol_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"fencecheck/goworker/internal/pgtest"
	"fencecheck/goworker/internal/protocol"
	"fencecheck/goworker/internal/schema"
	"fencecheck/goworker/internal/sealing"
)

const tenant = "11111111-1111-1111-1111-111111111111"
const otherTenant = "22222222-2222-2222-2222-222222222222"

type fixture struct {
	t   *testing.T
	ctx context.Context
	db  pgtest.DB
	p   *protocol.Protocol
	s   *protocol.Session // the worker's login role, bound to tenant
	ctl *protocol.Session // the control plane's (operator group), bound to tenant
}

func session(t *testing.T, dsn string) *protocol.Session {
	s, err := protocol.NewSession(dsn, "gotest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func setup(t *testing.T) *fixture {
	db := pgtest.Fresh(t)
	return &fixture{t, context.Background(), db, protocol.Correct(),
		session(t, db.Login(t, "fencecheck_worker", tenant)), session(t, db.Login(t, "fencecheck_operator", tenant))}
}

func connOf(t *testing.T, s *protocol.Session) *pgx.Conn {
	c, err := s.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fixture) conn() *pgx.Conn { return connOf(f.t, f.s) }

func (f *fixture) newRun(task string) string {
	id, err := f.p.CreateRun(f.ctx, connOf(f.t, f.ctl), tenant, task, map[string]any{"tool": "idem"}, 12)
	if err != nil {
		f.t.Fatalf("create run: %v", err)
	}
	return id
}

func (f *fixture) checkpoint(l protocol.Lease, rev int64, event string) (*protocol.Written, error) {
	w := f.writer()
	return w.Write(f.ctx, &protocol.Write{Lease: l, ExpectedRevision: rev, Transition: "checkpoint",
		State: map[string]any{"step": "x"}, SchemaVersion: 2, EventType: "agent.checkpoint",
		Payload: map[string]any{"run_id": l.RunID}, EventID: event})
}

func (f *fixture) writer() *protocol.Writer {
	seal, _ := sealing.New("")
	return &protocol.Writer{P: f.p, S: f.s, Seal: seal}
}

func TestMigrateIsIdempotent(t *testing.T) {
	f := setup(t)
	applied, err := schema.Migrate(f.ctx, f.db.Admin, nil)
	if err != nil || len(applied) != 0 {
		t.Fatalf("second migrate applied %v, err %v; want nothing", applied, err)
	}
}

func TestClaimGrantsOnceAndEpochGrows(t *testing.T) {
	f := setup(t)
	run := f.newRun("t1")
	c, err := f.p.ClaimRun(f.ctx, f.conn(), "A/1", 10000)
	if err != nil || c == nil || c.RunID != run || c.Epoch != 1 || c.Status != "running" {
		t.Fatalf("first claim: %+v %v", c, err)
	}
	again, err := f.p.ClaimRun(f.ctx, f.conn(), "B/1", 10000)
	if err != nil || again != nil {
		t.Fatalf("a held run was claimed again: %+v %v", again, err)
	}
	_, why, err := f.p.Takeover(f.ctx, f.conn(), run, "B/1", 10000)
	if err != nil || why != "held" {
		t.Fatalf("takeover of a live lease: %q %v; want held", why, err)
	}
}

func TestRenewNeverRevivesAnExpiredLease(t *testing.T) {
	f := setup(t)
	f.newRun("t1")
	c, _ := f.p.ClaimRun(f.ctx, f.conn(), "A/1", 10000)
	if _, err := f.p.Renew(f.ctx, f.conn(), c.Lease(), 50); err != nil {
		t.Fatalf("renew of a live lease: %v", err)
	}
	time.Sleep(120 * time.Millisecond)
	_, err := f.p.Renew(f.ctx, f.conn(), c.Lease(), 10000)
	if !errors.Is(err, protocol.ErrLeaseLost) || protocol.ReasonOf(err) != "expired" {
		t.Fatalf("renew after expiry: %v; want LeaseLost expired", err)
	}
	if _, err := f.checkpoint(c.Lease(), c.Revision, ""); !errors.Is(err, protocol.ErrLeaseLost) {
		t.Fatalf("checkpoint after expiry: %v; want LeaseLost", err)
	}
	next, why, err := f.p.Takeover(f.ctx, f.conn(), c.RunID, "B/1", 10000)
	if err != nil || next == nil || next.Epoch != c.Epoch+1 {
		t.Fatalf("takeover of the expired lease: %+v %q %v", next, why, err)
	}
	if err := f.p.Release(f.ctx, f.conn(), c.Lease()); !errors.Is(err, protocol.ErrLeaseLost) {
		t.Fatalf("stale release: %v; want LeaseLost", err)
	}
}

// A release of a lease that expired with nobody taking over goes through
// (as the reference implementation's), and the next grant is epoch + 1.
func TestReleaseAfterExpiry(t *testing.T) {
	f := setup(t)
	f.newRun("t1")
	c, _ := f.p.ClaimRun(f.ctx, f.conn(), "A/1", 50)
	time.Sleep(120 * time.Millisecond)
	if err := f.p.Release(f.ctx, f.conn(), c.Lease()); err != nil {
		t.Fatalf("release of the expired, untaken lease: %v", err)
	}
	next, err := f.p.ClaimRun(f.ctx, f.conn(), "B/1", 10000)
	if err != nil || next == nil || next.Epoch != c.Epoch+1 {
		t.Fatalf("claim after the release: %+v %v", next, err)
	}
}

// A row of another tenant is refused as a tenant matter (42501), before
// the protocol guards judge it (010_tenant_first.sql).
func TestCrossTenantRowRefusedAsPrivilege(t *testing.T) {
	f := setup(t)
	_, err := f.conn().Exec(f.ctx, `INSERT INTO outbox (event_id, tenant_id, run_id, event_type, payload)
VALUES (gen_random_uuid(), $1, gen_random_uuid(), 'x', '{}')`, otherTenant)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("insert of another tenant's outbox row: %v; want SQLSTATE 42501", err)
	}
}

func TestCheckpointCASAndStaleOwner(t *testing.T) {
	f := setup(t)
	f.newRun("t1")
	c, _ := f.p.ClaimRun(f.ctx, f.conn(), "A/1", 10000)
	out, err := f.checkpoint(c.Lease(), c.Revision, "")
	if err != nil || out.Revision != c.Revision+1 {
		t.Fatalf("checkpoint: %+v %v", out, err)
	}
	if _, err := f.checkpoint(c.Lease(), c.Revision, ""); !errors.Is(err, protocol.ErrRevisionConflict) {
		t.Fatalf("same expected revision twice: %v; want RevisionConflict", err)
	}
	stale := c.Lease()
	stale.Epoch--
	if _, err := f.checkpoint(stale, out.Revision, ""); !errors.Is(err, protocol.ErrLeaseLost) {
		t.Fatalf("older epoch: %v; want LeaseLost", err)
	}
	var ckpt, outbox bool
	err = f.conn().QueryRow(f.ctx, f.p.SQL.ReadBack, c.RunID, out.Revision, out.EventID).Scan(&ckpt, &outbox)
	if err != nil || !ckpt || !outbox {
		t.Fatalf("checkpoint and outbox row of the write: %v %v %v", ckpt, outbox, err)
	}
}

func TestWorkerRoleCannotForgeTheFencingToken(t *testing.T) {
	f := setup(t)
	run := f.newRun("t1")
	_, err := f.conn().Exec(f.ctx, `UPDATE agent_runs SET epoch = epoch + 100 WHERE run_id = $1`, run)
	if !errors.Is(protocol.FromDatabase(err), protocol.ErrFenceGuard) {
		t.Fatalf("epoch jump by the worker role: %v; want the fence guard", err)
	}
	c, _ := f.p.ClaimRun(f.ctx, f.conn(), "A/1", 10000)
	_, err = f.conn().Exec(f.ctx, `UPDATE agent_runs SET epoch = epoch + 1, owner = 'thief' WHERE run_id = $1`, c.RunID)
	if !errors.Is(protocol.FromDatabase(err), protocol.ErrFenceGuard) {
		t.Fatalf("takeover of a live lease by a raw statement: %v; want the fence guard", err)
	}
}

func TestOtherTenantSeesNothing(t *testing.T) {
	f := setup(t)
	run := f.newRun("t1")
	oc := connOf(t, session(t, f.db.Login(t, "fencecheck_worker", otherTenant)))
	if _, err := f.p.RunState(f.ctx, oc, run); !errors.Is(err, protocol.ErrRunNotFound) {
		t.Fatalf("other tenant reads the run: %v", err)
	}
	if c, _ := f.p.ClaimRun(f.ctx, oc, "X/1", 10000); c != nil {
		t.Fatalf("other tenant claimed %s", c.RunID)
	}
}

func TestIntentLedgerAndDispatchClaim(t *testing.T) {
	f := setup(t)
	f.newRun("t1")
	c, _ := f.p.ClaimRun(f.ctx, f.conn(), "A/1", 10000)
	opID := f.p.OperationID(tenant, c.RunID, "create_label", 1)
	req := map[string]any{"amount": 5}
	digest, _ := protocol.RequestDigest(req)
	w := f.writer()
	intent := func(rev int64, d string) (*protocol.Written, error) {
		return w.Write(f.ctx, &protocol.Write{Lease: c.Lease(), ExpectedRevision: rev, Transition: "intent",
			State: map[string]any{}, SchemaVersion: 2, EventType: "agent.tool_intent", Payload: map[string]any{},
			Effect: &protocol.Effect{OperationID: opID, StepID: "create_label", EffectVersion: 1, Tool: "idem",
				Capability: "idempotent", Digest: d, Request: req}})
	}
	out, err := intent(c.Revision, digest)
	if err != nil || out.LedgerStatus != "prepared" || out.Status != "waiting_tool" {
		t.Fatalf("intent: %+v %v", out, err)
	}
	if _, err := intent(out.Revision, "other-digest"); !errors.Is(err, protocol.ErrIntentConflict) {
		t.Fatalf("same operation_id, another request: %v; want IntentConflict", err)
	}
	op, err := f.p.DispatchClaim(f.ctx, f.conn(), "D/1", 10000, &opID)
	if err != nil || op == nil || op.Digest != digest {
		t.Fatalf("dispatch claim: %+v %v", op, err)
	}
	if again, _ := f.p.DispatchClaim(f.ctx, f.conn(), "D/2", 10000, &opID); again != nil {
		t.Fatal("a dispatching operation was claimed twice")
	}
	stale := *op
	stale.Revision--
	rid := "res-1"
	err = f.p.RecordResult(f.ctx, f.conn(), &stale, "D/1", toolAnswer(rid))
	if !errors.Is(err, protocol.ErrLedgerConflict) {
		t.Fatalf("result under a stale ledger revision: %v; want LedgerConflict", err)
	}
	if err := f.p.RecordResult(f.ctx, f.conn(), op, "D/1", toolAnswer(rid)); err != nil {
		t.Fatalf("result of the live claim: %v", err)
	}
}

// finished runs a new task to succeeded (a checkpoint and the success, each
// with its outbox row), its outbox relayed unless keepPending.
func (f *fixture) finished(task string, keepPending bool) string {
	run := f.newRun(task)
	c, err := f.p.ClaimRun(f.ctx, f.conn(), "A/1", 10000)
	if err != nil || c == nil || c.RunID != run {
		f.t.Fatalf("claim %s: %+v %v", task, c, err)
	}
	out, err := f.checkpoint(c.Lease(), c.Revision, "")
	if err != nil {
		f.t.Fatalf("checkpoint: %v", err)
	}
	w := f.writer()
	if _, err := w.Write(f.ctx, &protocol.Write{Lease: c.Lease(), ExpectedRevision: out.Revision, Transition: "succeed",
		State: map[string]any{"step": "done"}, SchemaVersion: 2, EventType: "agent.succeeded",
		Payload: map[string]any{"run_id": run}}); err != nil {
		f.t.Fatalf("succeed: %v", err)
	}
	if !keepPending {
		if _, err := f.conn().Exec(f.ctx, `UPDATE outbox SET published_at = clock_timestamp()
 WHERE run_id = $1 AND published_at IS NULL`, run); err != nil {
			f.t.Fatalf("relay: %v", err)
		}
	}
	return run
}

func (f *fixture) count(sql string, args ...any) int {
	var n int
	if err := f.conn().QueryRow(f.ctx, sql, args...).Scan(&n); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Retention: only finished, relayed, old enough tasks of the operator's
// own tenant go, each whole, archived before the commit; a locked task is
// skipped; every purge is audited; neither group deletes directly.
func TestPurgeArchivesThenDeletesFinishedTasks(t *testing.T) {
	f := setup(t)
	done := f.finished("old-1", false)
	f.finished("old-2", false)
	pending := f.finished("pending", true)
	queued := f.newRun("queued")
	ctl := connOf(t, f.ctl)
	for _, table := range []string{"agent_runs", "outbox", "agent_checkpoints"} {
		_, err := ctl.Exec(f.ctx, "DELETE FROM "+table+" WHERE run_id = $1", done)
		if protocol.SQLState(err) != "42501" {
			t.Fatalf("the operator deleted from %s directly: %v", table, err)
		}
	}
	if _, err := f.conn().Exec(f.ctx, `SELECT fencecheck.operator_purge('old-1', 0)`); protocol.SQLState(err) != "42501" {
		t.Fatalf("the worker role ran operator_purge: %v", err)
	}
	archive := t.TempDir() + "/archive.jsonl"
	ticket := "RET-1"
	purge := func(olderThan, limit int64) []string {
		out, err := f.p.Purge(f.ctx, ctl, olderThan, limit, "retention", &ticket, archive)
		if err != nil {
			t.Fatalf("purge: %v", err)
		}
		return out["purged_tasks"].([]string)
	}
	if got := purge(3600000, 100); len(got) != 0 {
		t.Fatalf("purged within the retention: %v", got)
	}
	if got := purge(0, 1); len(got) != 1 || got[0] != "old-1" {
		t.Fatalf("purge with limit 1: %v; want [old-1]", got)
	}
	// old-2 held by another session: skipped, not waited for.
	other := connOf(t, session(t, f.db.Login(t, "fencecheck_operator", tenant)))
	tx, err := other.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `SELECT 1 FROM agent_tasks WHERE task_id = 'old-2' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if got := purge(0, 100); len(got) != 0 {
		t.Fatalf("purged beside the lock: %v; want nothing", got)
	}
	_ = tx.Rollback(f.ctx)
	if got := purge(0, 100); len(got) != 1 || got[0] != "old-2" {
		t.Fatalf("last purge: %v; want [old-2]", got)
	}
	for _, table := range []string{"agent_runs", "agent_checkpoints", "outbox", "tool_operations"} {
		if n := f.count("SELECT count(*) FROM "+table+" WHERE run_id = $1", done); n != 0 {
			t.Errorf("%d rows of the purged run left in %s", n, table)
		}
	}
	if n := f.count(`SELECT count(*) FROM agent_runs WHERE run_id = ANY($1::uuid[])`, []string{pending, queued}); n != 2 {
		t.Errorf("%d of the 2 unpurgeable runs left", n)
	}
	var tasks []int
	rows, err := ctl.Query(f.ctx, `SELECT (before->>'tasks')::int FROM operator_actions WHERE action = 'purge' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n int
		_ = rows.Scan(&n)
		tasks = append(tasks, n)
	}
	if fmt.Sprint(tasks) != "[0 1 0 1]" {
		t.Errorf("audited task counts %v; want [0 1 0 1]", tasks)
	}
	body, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	if len(lines) != 2 {
		t.Fatalf("archive has %d lines; want 2", len(lines))
	}
	var doc struct {
		TaskID string `json:"task_id"`
		Runs   []struct {
			Run         map[string]any   `json:"run"`
			Checkpoints []map[string]any `json:"checkpoints"`
			Outbox      []map[string]any `json:"outbox"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.TaskID != "old-1" || len(doc.Runs) != 1 || doc.Runs[0].Run["run_id"] != done ||
		len(doc.Runs[0].Checkpoints) != 2 || len(doc.Runs[0].Outbox) != 2 {
		t.Errorf("archive document of old-1: %s", lines[0])
	}
}

// A run its task's retry superseded is never queued again (contract
// section 5, retry_run): when a dispatcher's answer settles its last doubt,
// the dispatcher's own (worker) session ends it cancelled, which the guard
// lets only such a run through; and a control-plane session's plain move of
// a superseded run paused for a person back to the queue is refused
// (migration 013).
func TestSupersededRunEndsWhenItsDoubtSettles(t *testing.T) {
	f := setup(t)
	old := f.newRun("t1")
	c, _ := f.p.ClaimRun(f.ctx, f.conn(), "A/1", 10000)
	opID := f.p.OperationID(tenant, c.RunID, "create_label", 1)
	req := map[string]any{"amount": 5}
	digest, _ := protocol.RequestDigest(req)
	if _, err := f.writer().Write(f.ctx, &protocol.Write{Lease: c.Lease(), ExpectedRevision: c.Revision,
		Transition: "intent", State: map[string]any{}, SchemaVersion: 2, EventType: "agent.tool_intent",
		Payload: map[string]any{}, Effect: &protocol.Effect{OperationID: opID, StepID: "create_label",
			EffectVersion: 1, Tool: "idem", Capability: "idempotent", Digest: digest, Request: req}}); err != nil {
		t.Fatalf("intent: %v", err)
	}
	op, err := f.p.DispatchClaim(f.ctx, f.conn(), "D/1", 10000, &opID)
	if err != nil || op == nil {
		t.Fatalf("dispatch claim: %+v %v", op, err)
	}
	// Paused in doubt with its claim live (as a freeze leaves it), planted by
	// the superuser; then the control plane retries the task.
	admin, err := pgx.Connect(f.ctx, f.db.Admin)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(f.ctx)
	if _, err := admin.Exec(f.ctx, `UPDATE agent_runs SET status = 'paused_indoubt', owner = NULL,
 lease_expires_at = NULL WHERE run_id = $1`, old); err != nil {
		t.Fatal(err)
	}
	retry, _, err := f.p.RetryRun(f.ctx, connOf(t, f.ctl), "t1")
	if err != nil {
		t.Fatalf("retry of a paused run: %v", err)
	}
	if err := f.p.RecordResult(f.ctx, f.conn(), op, "D/1", toolAnswer("res-1")); err != nil {
		t.Fatalf("the answer that settles the last doubt: %v", err)
	}
	var status, reason, newStatus string
	if err := admin.QueryRow(f.ctx, `SELECT status, coalesce(terminal_reason, '') FROM agent_runs
 WHERE run_id = $1`, old).Scan(&status, &reason); err != nil {
		t.Fatal(err)
	}
	if err := admin.QueryRow(f.ctx, `SELECT status FROM agent_runs WHERE run_id = $1`, retry).Scan(&newStatus); err != nil {
		t.Fatal(err)
	}
	if status != "cancelled" || !strings.Contains(reason, "superseded by run "+retry) || newStatus != "queued" {
		t.Fatalf("old run %s (%q), retry %s; want cancelled (superseded by %s), queued", status, reason, newStatus, retry)
	}
	// The retry does the step again: the old run's success asks for compensation.
	var compensations int
	if err := admin.QueryRow(f.ctx, `SELECT count(*) FROM outbox WHERE run_id = $1
 AND event_type = 'agent.compensation_required' AND payload->>'remote_id' = 'res-1'`, old).Scan(&compensations); err != nil {
		t.Fatal(err)
	}
	if compensations != 1 {
		t.Fatalf("%d compensation events for the superseded run's success; want 1", compensations)
	}
	human := f.newRun("t2")
	if _, err := admin.Exec(f.ctx, `UPDATE agent_runs SET status = 'paused_human' WHERE run_id = $1`, human); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.p.RetryRun(f.ctx, connOf(t, f.ctl), "t2"); err != nil {
		t.Fatalf("retry of a run paused for a person: %v", err)
	}
	_, err = connOf(t, f.ctl).Exec(f.ctx, `UPDATE agent_runs SET status = 'queued',
 next_attempt_at = clock_timestamp() WHERE run_id = $1`, human)
	if err == nil || !strings.Contains(err.Error(), "superseded") {
		t.Fatalf("the control plane queued a superseded run: %v", err)
	}
}

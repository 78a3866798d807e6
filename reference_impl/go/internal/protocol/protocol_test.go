package protocol_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"fencecheck/goworker/internal/pgtest"
	"fencecheck/goworker/internal/protocol"
	"fencecheck/goworker/internal/schema"
)

const tenant = "11111111-1111-1111-1111-111111111111"
const otherTenant = "22222222-2222-2222-2222-222222222222"

type fixture struct {
	t   *testing.T
	ctx context.Context
	db  pgtest.DB
	p   *protocol.Protocol
	s   *protocol.Session
}

func setup(t *testing.T) *fixture {
	db := pgtest.Fresh(t)
	s, err := protocol.NewSession(db.Worker, tenant, "gotest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &fixture{t, context.Background(), db, protocol.Correct(), s}
}

func (f *fixture) conn() *pgx.Conn {
	c, err := f.s.Conn(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *fixture) newRun(task string) string {
	id, err := f.p.CreateRun(f.ctx, f.conn(), tenant, task, map[string]any{"tool": "idem"}, 12)
	if err != nil {
		f.t.Fatalf("create run: %v", err)
	}
	return id
}

func (f *fixture) checkpoint(l protocol.Lease, rev int64, event string) (*protocol.Written, error) {
	w := &protocol.Writer{P: f.p, S: f.s}
	return w.Write(f.ctx, &protocol.Write{Lease: l, ExpectedRevision: rev, Transition: "checkpoint",
		State: map[string]any{"step": "x"}, SchemaVersion: 2, EventType: "agent.checkpoint",
		Payload: map[string]any{"run_id": l.RunID}, EventID: event})
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
	other, err := f.s.For(otherTenant)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	oc, err := other.Conn(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
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
	w := &protocol.Writer{P: f.p, S: f.s}
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

package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"fencecheck/goworker/internal/injection"
	"fencecheck/goworker/internal/protocol"
)

// Exit codes of run mode (worker contract section 1).
const (
	ExitOK        = 0
	ExitError     = 1
	ExitCancelled = 10
	ExitInDoubt   = 11
	ExitSchema    = 12
)

var errFinished = errors.New("execution finished")

// Run is the autonomous loop: claim, execute under a heartbeat, repeat.
// Invariants: "not acquired" is never a task failure; an execution whose
// heartbeat failed stops before its next step or side effect (its context
// is cancelled, which also aborts a database call in flight); SIGTERM stops
// claiming, lets the current short transaction finish, gives the lease back
// and exits 0.
func Run(rt *Runtime, runID string, once, exitWhenIdle bool, stop *atomic.Bool) int {
	for !stop.Load() {
		claim, why, err := acquire(rt, runID)
		if err != nil {
			logf(protocol.Lease{RunID: runID, Owner: rt.S.Owner()}, "claim failed: %v", err)
			return ExitError
		}
		if claim == nil {
			if runID != "" && (why == "missing" || why == "terminal" || why == "paused") {
				logf(protocol.Lease{RunID: runID, Owner: rt.S.Owner()}, "nothing to take over: %s", why)
				return ExitOK
			}
			if exitWhenIdle && runID == "" {
				return ExitOK
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		injection.Point("after_lease_acquired", claim.RunID, &claim.Epoch, &claim.Revision, "")
		code := execute(rt, claim, stop)
		if once || runID != "" || code != ExitOK {
			return code
		}
	}
	return ExitOK
}

func acquire(rt *Runtime, runID string) (*protocol.Claim, string, error) {
	ctx := context.Background()
	conn, err := rt.Main.Conn(ctx)
	if err != nil {
		return nil, "", err
	}
	done := record("claim", ids{RunID: runID}, map[string]any{"owner": rt.S.Owner()})
	var claim *protocol.Claim
	why := "acquired"
	if runID == "" {
		claim, err = rt.P.ClaimRun(ctx, conn, rt.S.Owner(), rt.S.LeaseTTLMS)
		if claim == nil && err == nil {
			why = "none"
		}
	} else {
		claim, why, err = rt.P.Takeover(ctx, conn, runID, rt.S.Owner(), rt.S.LeaseTTLMS)
	}
	rt.Main.Check(err)
	if err == nil && claim == nil {
		err = &protocol.Error{Class: "NotClaimable", Reason: why, Msg: "not claimable: " + why}
		done(err, ids{})
		return nil, why, nil
	}
	if err != nil {
		done(err, ids{})
		return nil, why, err
	}
	done(nil, ids{RunID: claim.RunID, Epoch: i64(claim.Epoch), Revision: i64(claim.Revision)})
	return claim, why, nil
}

func execute(rt *Runtime, claim *protocol.Claim, stop *atomic.Bool) int {
	lease := claim.Lease()
	ctx, cancel := context.WithCancelCause(context.Background())
	hb := rt.StartHeartbeat(ctx, cancel, lease, time.Duration(rt.S.HeartbeatMS)*time.Millisecond,
		time.Duration(rt.S.HeartbeatTimeoutMS)*time.Millisecond)
	logf(lease, "lease acquired: revision %d, status %s", claim.Revision, claim.Status)
	x := &Execution{rt: rt, lease: lease, ctx: ctx, draining: stop}
	status, err := x.Run()
	cancelled := ctx.Err() != nil
	cancel(errFinished)
	select {
	case <-hb:
	case <-time.After(5 * time.Second):
	}
	switch {
	case err == nil && status == "paused_indoubt":
		return ExitInDoubt
	case err == nil:
		return ExitOK
	case errors.Is(err, errDraining):
		release(rt, lease)
		return ExitOK
	case errors.Is(err, protocol.ErrExecutionCancelled), errors.Is(err, protocol.ErrLeaseLost),
		errors.Is(err, protocol.ErrCommitOutcomeUnknown):
		logf(lease, "execution stopped: %v", err)
		return ExitCancelled
	case errors.Is(err, protocol.ErrSchemaVersionUnknown), errors.Is(err, protocol.ErrCheckpointCorrupt):
		logf(lease, "checkpoint refused: %v", err)
		release(rt, lease)
		return ExitSchema
	case errors.Is(err, protocol.ErrCommitInconsistent):
		logf(lease, "ALERT: commit read-back inconsistent; run must be frozen: %v", err)
		return ExitInDoubt
	case cancelled:
		logf(lease, "execution stopped after cancellation: %v", err)
		return ExitCancelled
	}
	logf(lease, "execution failed: %v", err)
	return ExitError
}

func release(rt *Runtime, lease protocol.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := record("release", ids{RunID: lease.RunID, Epoch: i64(lease.Epoch)}, nil)
	conn, err := rt.Main.Conn(ctx)
	if err == nil {
		err = rt.P.Release(ctx, conn, lease)
	}
	done(err, ids{})
	if err != nil {
		logf(lease, "release failed; the lease will expire: %v", err)
	}
}

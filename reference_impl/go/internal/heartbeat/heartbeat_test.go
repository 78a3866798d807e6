package heartbeat

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// The first unconfirmed renewal cancels the execution with its cause, and
// the heartbeat ends: a lease is never renewed again after that.
func TestUnconfirmedRenewalCancelsTheExecution(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	calls := 0
	renew := func(c context.Context) error {
		calls++
		if _, ok := c.Deadline(); !ok {
			t.Error("a renewal ran without its own timeout")
		}
		if calls == 3 {
			return errors.New("lease lost")
		}
		return nil
	}
	done := make(chan struct{})
	go func() {
		Heartbeat(ctx, cancel, 5*time.Millisecond, time.Second, renew, func() {},
			func(c context.CancelCauseFunc, cause error) { c(cause) })
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the heartbeat did not end after an unconfirmed renewal")
	}
	if calls != 3 || ctx.Err() == nil || !strings.Contains(context.Cause(ctx).Error(), "lease renewal unconfirmed") {
		t.Fatalf("calls %d, cause %v", calls, context.Cause(ctx))
	}
}

// A renewal that hangs is bounded by its own timeout, and counts as unconfirmed.
func TestHangingRenewalTimesOut(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	started := time.Now()
	Heartbeat(ctx, cancel, time.Millisecond, 20*time.Millisecond,
		func(c context.Context) error { <-c.Done(); return c.Err() }, func() {},
		func(c context.CancelCauseFunc, cause error) { c(cause) })
	if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) || time.Since(started) > 2*time.Second {
		t.Fatalf("cause %v after %v", context.Cause(ctx), time.Since(started))
	}
}

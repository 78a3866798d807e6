// Package heartbeat is the English seed's Heartbeat (section 7), completed:
// a ticker, one renewal per tick under its own timeout context, and the
// first renewal that is not confirmed (refused, failed, or no answer in
// time) cancels the execution's context with its cause and ends the loop. A
// lease is never resurrected; cancellation is not remote revocation, it only
// stops new work.
package heartbeat

import (
	"context"
	"fmt"
	"time"
)

// Heartbeat renews every interval until ctx ends or a renewal is
// unconfirmed; then it calls onUnconfirmed (correct code: cancel(cause)).
// before runs ahead of each renewal (the before_renew injection point).
func Heartbeat(ctx context.Context, cancel context.CancelCauseFunc,
	interval, timeout time.Duration, renew func(context.Context) error,
	before func(), onUnconfirmed func(context.CancelCauseFunc, error)) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			before()
			if ctx.Err() != nil {
				return
			}
			callCtx, stop := context.WithTimeout(ctx, timeout)
			err := renew(callCtx)
			stop()
			if err != nil {
				onUnconfirmed(cancel, fmt.Errorf("lease renewal unconfirmed: %w", err))
				return
			}
		}
	}
}

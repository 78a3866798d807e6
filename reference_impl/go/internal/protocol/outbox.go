package protocol

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/jackc/pgx/v5"

	"fencecheck/goworker/internal/injection"
	"fencecheck/goworker/internal/tool"
)

// Relay publishes one batch of pending outbox rows (Chinese seed section
// 11): lock them (SKIP LOCKED: another relay's rows are passed by), publish
// each, mark only what the broker acknowledged. A crash between ack and mark
// republishes: at-least-once, never at-most-once.
func (p *Protocol) Relay(ctx context.Context, db DB, broker *tool.Client, limit int) ([]string, error) {
	published, firstRun := []string{}, ""
	err := pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, p.SQL.OutboxLockBatch, limit)
		if err != nil {
			return err
		}
		type pending struct {
			id                 int64
			event, run, tenant string
			eventType          string
			payload            []byte
		}
		var batch []pending
		for rows.Next() {
			var r pending
			if err := rows.Scan(&r.id, &r.event, &r.run, &r.tenant, &r.eventType, &r.payload); err != nil {
				rows.Close()
				return err
			}
			batch = append(batch, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(batch) > 0 {
			// The batch is locked in this open transaction; nothing published.
			firstRun = batch[0].run
			injection.Point("after_outbox_batch_locked", firstRun, nil, nil, "")
		}
		var acked []int64
		for _, r := range batch {
			payload, _ := Decode(r.payload)
			if m, ok := payload.(map[string]any); ok {
				// The row's own tenant: a consumer at a broker shared by tenants
				// tells its events by it (a compensation request's payload has none).
				m["event_id"], m["run_id"], m["tenant_id"] = r.event, r.run, r.tenant
			}
			if err := broker.Publish(r.event, r.eventType, payload); err != nil {
				fmt.Fprintf(os.Stderr, "relay: publish of %s failed: %v; the rest stays pending\n", r.event, err)
				break
			}
			injection.Point("after_broker_ack_before_outbox_mark", r.run, nil, nil, "")
			acked = append(acked, r.id)
			published = append(published, r.event)
		}
		if len(acked) == 0 {
			return nil
		}
		tag, err := tx.Exec(ctx, p.SQL.OutboxMark, acked)
		if err == nil && tag.RowsAffected() != int64(len(acked)) {
			err = fmt.Errorf("marked %d of %d acknowledged outbox rows", tag.RowsAffected(), len(acked))
		}
		return err
	})
	if err == nil && len(published) > 0 {
		// Published and marked, committed: the next cycle starts from here.
		injection.Point("after_outbox_mark_commit", firstRun, nil, nil, "")
	}
	return published, err
}

// Consumer applies each broker message's business effect once per event_id.
type Consumer struct {
	P      *Protocol
	Broker *tool.Client
	Tenant string
	// mu guards after: an ops process may run two async consume cycles at once.
	mu    sync.Mutex
	after map[string]int64
}

// position is the broker sequence consumer name has read past.
func (c *Consumer) position(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.after[name]
}

// movePast moves name's position to seq, never back (another cycle of the
// same name may have moved it further meanwhile).
func (c *Consumer) movePast(name string, seq int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.after == nil {
		c.after = map[string]int64{}
	}
	c.after[name] = max(c.after[name], seq)
}

// Cycle reads the broker's new messages and processes those of this tenant.
func (c *Consumer) Cycle(ctx context.Context, db DB, name string) (map[string]int, error) {
	msgs, err := c.Broker.Messages(c.position(name))
	if err != nil {
		return nil, err
	}
	if len(msgs) > 0 {
		// Delivered by the broker, nothing of them committed here yet.
		injection.Point("after_consumer_read", "", nil, nil, msgs[0].EventID)
	}
	consumed, duplicates := 0, 0
	// The position moves past the read only once every message of it is
	// applied: a read may come out of order, and a failure after a higher
	// message's apply must not skip a lower one not applied yet
	// (L[reordered_delivery]); the applied ones come back as duplicates.
	past := c.position(name)
	for _, m := range msgs {
		if c.P.ConsumerPastBeforeApply {
			c.movePast(name, m.Seq)
		}
		past = max(past, m.Seq)
		if t, ok := m.Payload["tenant_id"].(string); ok && t != c.Tenant {
			continue // another tenant's event: not ours to apply
		}
		first, err := c.Process(ctx, db, name, m)
		if err != nil {
			// Not past this read: the next cycle reads it again (L[apply_fails]).
			return nil, err
		}
		if first {
			consumed++
		} else {
			duplicates++
		}
	}
	c.movePast(name, past)
	return map[string]int{"consumed": consumed, "duplicates": duplicates}, nil
}

// Process applies one message in its own transaction: the dedup row first,
// then the effect; false when the event was already processed.
func (c *Consumer) Process(ctx context.Context, db DB, name string, m tool.Message) (bool, error) {
	run, _ := m.Payload["run_id"].(string)
	first := false
	err := pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		if c.P.SQL.ConsumeDedup != "" {
			rows, err := tx.Query(ctx, c.P.SQL.ConsumeDedup, name, m.EventID)
			if err != nil {
				return err
			}
			got := rows.Next()
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			if !got {
				return nil // a concurrent or earlier consumer of this event won
			}
		}
		first = true
		_, err := tx.Exec(ctx, c.P.SQL.ConsumeEffect, name, m.EventID, m.Topic+":"+run)
		return err
	})
	if err == nil && first {
		// The dedup row and the business effect committed together: the event
		// counts as processed, whatever happens to this consumer next.
		injection.Point("after_consumer_dedup_commit", run, nil, nil, m.EventID)
	}
	return first, err
}

-- name: outbox_lock_batch
-- Lock a batch of unpublished outbox rows in this transaction, skipping rows another relay holds.
-- Every row is the session's tenant's (row level security): the message names it.
SELECT id, event_id, run_id, event_type, payload, fencecheck.session_tenant() AS tenant_id
  FROM fencecheck.outbox_lock_batch(%(limit)s);

-- name: outbox_mark_published
-- Mark rows published after the broker acknowledged them.
SELECT fencecheck.outbox_mark_published(%(ids)s) AS marked;

-- name: consume_dedup
-- Consumer, in its own transaction: the dedup row first; no row back means already processed.
INSERT INTO consumed_events (consumer_name, event_id) VALUES (%(consumer)s, %(event_id)s)
ON CONFLICT DO NOTHING
RETURNING event_id;

-- name: consume_effect
-- Consumer's business effect, in the same transaction as its dedup row.
INSERT INTO consumer_effects (consumer_name, event_id, effect)
VALUES (%(consumer)s, %(event_id)s, %(effect)s);

-- name: claim
-- Claim any runnable run of the tenant (expired lease first, then due queued), SKIP LOCKED, epoch + 1.
SELECT outcome, run_id, owner, epoch, revision, status, lease_expires_at,
       previous_owner, expired_for_ms, lock_wait_ms
  FROM fencecheck.claim(%(owner)s, %(ttl_ms)s);

-- name: takeover
-- Targeted takeover of one run; waits on the row lock; outcome says why when nothing was granted.
SELECT outcome, run_id, owner, epoch, revision, status, lease_expires_at,
       previous_owner, expired_for_ms, lock_wait_ms
  FROM fencecheck.takeover(%(run_id)s, %(owner)s, %(ttl_ms)s);

-- name: renew
-- Extend the lease only while owner and epoch match and the lease is unexpired.
SELECT outcome, lease_expires_at FROM fencecheck.renew(%(run_id)s, %(owner)s, %(epoch)s, %(ttl_ms)s);

-- name: release
-- Give the lease back (run re-queued at once); the epoch is kept.
SELECT outcome FROM fencecheck.release(%(run_id)s, %(owner)s, %(epoch)s);

-- name: create_run
-- New task with its first run (queued), active_run_id set in the same transaction.
SELECT run_id, task_id FROM fencecheck.create_run(%(task_id)s, %(input)s, %(max_attempts)s);

-- name: retry_run
-- New run_id under the same task; active_run_id switched in the same transaction.
SELECT run_id, task_id, retry_of FROM fencecheck.retry_run(%(task_id)s);

-- name: cancel_run
-- Cancel: prepared operations forbidden, in-flight ones left as they are.
SELECT run_status, operations FROM fencecheck.cancel_run(%(run_id)s, %(reason)s);

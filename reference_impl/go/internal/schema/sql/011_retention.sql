-- Retention (worker contract section 5, the optional op purge; Chinese seed
-- section 12): archive, then delete, old finished tasks of the operator's
-- own tenant.
--
-- Neither group may DELETE anything (009): the deletion is the one
-- control-plane function fencecheck.operator_purge, SECURITY DEFINER,
-- executable by the operator group only. The Go code picks the tasks
-- (Statements.PurgeCandidates: oldest first, SKIP LOCKED, up to the limit,
-- the task row locked in its transaction), calls this function per task,
-- writes and syncs the archive, audits, and only then commits
-- (internal/protocol/retention.go). The function does not trust the pick:
-- under the locks of the task, its runs and its operations it judges the
-- task itself and deletes it only when every run is terminal and untouched
-- since the cut, no operation is prepared, dispatching or unknown (in
-- doubt is never deleted) and every outbox row is published; else it
-- deletes nothing and answers NULL. A task with a run another session
-- holds locked is skipped (NULL), never waited for.
--
-- It answers the document of what it deleted (the task, each run with its
-- checkpoints, operations and outbox rows, read under those locks), which
-- the caller appends to its archive before the transaction commits.
--
-- The tenant is the session's binding (session_tenant: session_user), and
-- row level security, forced on every table, scopes the owner's statements
-- to it as well: another tenant's task is not found.

-- The audit trail of operator decisions stays when a run is purged: its
-- run_id becomes NULL (as in the Python reference schema).
ALTER TABLE public.operator_actions
  DROP CONSTRAINT operator_actions_run_id_fkey,
  ADD CONSTRAINT operator_actions_run_id_fkey FOREIGN KEY (run_id)
    REFERENCES public.agent_runs (run_id) ON DELETE SET NULL;

CREATE FUNCTION fencecheck.operator_purge(p_task_id text, p_older_than_ms bigint)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_tenant uuid := fencecheck.session_tenant();
  v_cut timestamptz;
  v_runs uuid[];
  v_total integer;
  v_doc jsonb;
BEGIN
  IF v_tenant IS NULL THEN
    RAISE EXCEPTION 'session % is bound to no tenant', session_user USING ERRCODE = '42501';
  END IF;
  IF p_task_id IS NULL OR p_older_than_ms IS NULL OR p_older_than_ms < 0 THEN
    RAISE EXCEPTION 'a task and older_than_ms >= 0' USING ERRCODE = '22023';
  END IF;
  v_cut := clock_timestamp() - p_older_than_ms * interval '1 millisecond';

  PERFORM 1 FROM public.agent_tasks k
    WHERE k.tenant_id = v_tenant AND k.task_id = p_task_id FOR UPDATE SKIP LOCKED;
  IF NOT FOUND THEN
    RETURN NULL;  -- not this tenant's, gone, or held by another session
  END IF;
  SELECT count(*) INTO v_total FROM public.agent_runs r
   WHERE r.tenant_id = v_tenant AND r.task_id = p_task_id;
  SELECT COALESCE(array_agg(s.run_id), '{}') INTO v_runs
    FROM (SELECT r.run_id FROM public.agent_runs r
           WHERE r.tenant_id = v_tenant AND r.task_id = p_task_id
             FOR UPDATE SKIP LOCKED) s;
  IF cardinality(v_runs) <> v_total THEN
    RETURN NULL;  -- a run of it is held by another session
  END IF;
  PERFORM 1 FROM public.tool_operations o WHERE o.run_id = ANY (v_runs) FOR UPDATE;

  IF EXISTS (SELECT 1 FROM public.agent_runs r
              WHERE r.run_id = ANY (v_runs)
                AND (r.status NOT IN ('succeeded', 'failed', 'cancelled') OR r.updated_at >= v_cut))
     OR EXISTS (SELECT 1 FROM public.tool_operations o
                 WHERE o.run_id = ANY (v_runs) AND o.status IN ('prepared', 'dispatching', 'unknown'))
     OR EXISTS (SELECT 1 FROM public.outbox x
                 WHERE x.run_id = ANY (v_runs) AND x.published_at IS NULL) THEN
    RETURN NULL;  -- not finished, not old enough, in doubt, or not yet relayed
  END IF;

  SELECT jsonb_build_object(
           'task_id', p_task_id, 'tenant_id', v_tenant, 'archived_at', clock_timestamp(),
           'runs', COALESCE(jsonb_agg(jsonb_build_object(
             'run', to_jsonb(r),
             'checkpoints', (SELECT COALESCE(jsonb_agg(to_jsonb(c) ORDER BY c.revision), '[]'::jsonb)
                               FROM public.agent_checkpoints c WHERE c.run_id = r.run_id),
             'operations', (SELECT COALESCE(jsonb_agg(to_jsonb(o) ORDER BY o.created_at, o.operation_id),
                                            '[]'::jsonb)
                              FROM public.tool_operations o WHERE o.run_id = r.run_id),
             'outbox', (SELECT COALESCE(jsonb_agg(to_jsonb(x) ORDER BY x.id), '[]'::jsonb)
                          FROM public.outbox x WHERE x.run_id = r.run_id))
             ORDER BY r.created_at, r.run_id), '[]'::jsonb))
    INTO v_doc
    FROM public.agent_runs r WHERE r.run_id = ANY (v_runs);

  UPDATE public.agent_tasks k SET active_run_id = NULL
   WHERE k.tenant_id = v_tenant AND k.task_id = p_task_id;
  DELETE FROM public.agent_checkpoints c WHERE c.run_id = ANY (v_runs);
  DELETE FROM public.outbox x WHERE x.run_id = ANY (v_runs);
  DELETE FROM public.tool_operations o WHERE o.run_id = ANY (v_runs);
  DELETE FROM public.agent_runs r WHERE r.run_id = ANY (v_runs);
  DELETE FROM public.agent_tasks k WHERE k.tenant_id = v_tenant AND k.task_id = p_task_id;
  RETURN v_doc;
END
$$;
ALTER FUNCTION fencecheck.operator_purge(text, bigint) OWNER TO fencecheck_owner;
REVOKE ALL ON FUNCTION fencecheck.operator_purge(text, bigint)
  FROM PUBLIC, fencecheck_worker, fencecheck_operator;
GRANT EXECUTE ON FUNCTION fencecheck.operator_purge(text, bigint) TO fencecheck_operator;

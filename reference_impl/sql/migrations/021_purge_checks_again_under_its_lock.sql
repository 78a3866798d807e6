-- The retention purge judges a task again once it holds the task's row.
-- 009 judged "every run finished, nothing in doubt, nothing unpublished" only
-- in the statement that picks and locks the tasks: a retry_run that committed
-- between that statement's start and its lock on the task row was re-checked
-- on the task row alone (PostgreSQL re-evaluates the other tables' subqueries
-- on the old snapshot), so the retry's new queued run was deleted with the
-- task (blind hunt 65's reader; the Go reference re-checks under its locks).
CREATE OR REPLACE FUNCTION fencecheck.operator_purge(p_older_than_ms bigint, p_limit integer,
                                          p_reason text, p_ticket text DEFAULT NULL)
RETURNS TABLE (task_id text, archived jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_tenant uuid := fencecheck._tenant();
  v_cut timestamptz := clock_timestamp() - p_older_than_ms * interval '1 millisecond';
  t record;
  v_runs uuid[];
  v_doc jsonb;
  n integer := 0;
BEGIN
  IF p_older_than_ms IS NULL OR p_older_than_ms < 0 OR p_limit IS NULL OR p_limit < 1 THEN
    RAISE EXCEPTION 'older_than_ms >= 0 and limit >= 1' USING ERRCODE = '22023';
  END IF;
  FOR t IN
    SELECT k.task_id AS id FROM public.agent_tasks k
     WHERE k.tenant_id = v_tenant
       AND NOT EXISTS (SELECT 1 FROM public.agent_runs r
                        WHERE r.tenant_id = k.tenant_id AND r.task_id = k.task_id
                          AND (r.status NOT IN ('succeeded', 'failed', 'cancelled')
                               OR r.updated_at >= v_cut))
       AND NOT EXISTS (SELECT 1 FROM public.agent_runs r
                         JOIN public.tool_operations o ON o.run_id = r.run_id
                        WHERE r.tenant_id = k.tenant_id AND r.task_id = k.task_id
                          AND o.status IN ('prepared', 'dispatching', 'unknown'))
       AND NOT EXISTS (SELECT 1 FROM public.agent_runs r
                         JOIN public.outbox x ON x.run_id = r.run_id
                        WHERE r.tenant_id = k.tenant_id AND r.task_id = k.task_id
                          AND x.published_at IS NULL)
     ORDER BY k.updated_at
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  LOOP
    -- Judged again now that the task is locked, by a statement of its own
    -- (its own snapshot): the pick's NOT EXISTS saw the runs as of the pick's
    -- start, and a retry that committed between that and the lock left the
    -- task row re-checked but its new run unseen.
    IF EXISTS (SELECT 1 FROM public.agent_runs r
                WHERE r.tenant_id = v_tenant AND r.task_id = t.id
                  AND (r.status NOT IN ('succeeded', 'failed', 'cancelled')
                       OR r.updated_at >= v_cut))
       OR EXISTS (SELECT 1 FROM public.agent_runs r
                    JOIN public.tool_operations o ON o.run_id = r.run_id
                   WHERE r.tenant_id = v_tenant AND r.task_id = t.id
                     AND o.status IN ('prepared', 'dispatching', 'unknown'))
       OR EXISTS (SELECT 1 FROM public.agent_runs r
                    JOIN public.outbox x ON x.run_id = r.run_id
                   WHERE r.tenant_id = v_tenant AND r.task_id = t.id
                     AND x.published_at IS NULL) THEN
      CONTINUE;
    END IF;
    SELECT array_agg(r.run_id) INTO v_runs FROM public.agent_runs r
     WHERE r.tenant_id = v_tenant AND r.task_id = t.id;
    SELECT jsonb_build_object(
             'task_id', t.id, 'tenant_id', v_tenant, 'archived_at', clock_timestamp(),
             'runs', COALESCE(jsonb_agg(jsonb_build_object(
               'run', to_jsonb(r),
               'checkpoints', (SELECT COALESCE(jsonb_agg(to_jsonb(c) ORDER BY c.revision), '[]')
                                 FROM public.agent_checkpoints c WHERE c.run_id = r.run_id),
               'operations', (SELECT COALESCE(jsonb_agg(to_jsonb(o)), '[]')
                                FROM public.tool_operations o WHERE o.run_id = r.run_id),
               'outbox', (SELECT COALESCE(jsonb_agg(to_jsonb(x) ORDER BY x.id), '[]')
                            FROM public.outbox x WHERE x.run_id = r.run_id))), '[]'))
      INTO v_doc
      FROM public.agent_runs r WHERE r.run_id = ANY (v_runs);
    UPDATE public.agent_tasks k SET active_run_id = NULL
     WHERE k.tenant_id = v_tenant AND k.task_id = t.id;
    DELETE FROM public.agent_checkpoints c WHERE c.run_id = ANY (v_runs);
    DELETE FROM public.outbox x WHERE x.run_id = ANY (v_runs);
    DELETE FROM public.tool_operations o WHERE o.run_id = ANY (v_runs);
    DELETE FROM public.agent_runs r WHERE r.run_id = ANY (v_runs);
    DELETE FROM public.agent_tasks k WHERE k.tenant_id = v_tenant AND k.task_id = t.id;
    n := n + 1;
    task_id := t.id;
    archived := v_doc;
    RETURN NEXT;
  END LOOP;
  PERFORM fencecheck._audit(NULL, NULL, 'purge', p_reason, p_ticket,
                            jsonb_build_object('tasks', n, 'older_than_ms', p_older_than_ms));
END
$$;

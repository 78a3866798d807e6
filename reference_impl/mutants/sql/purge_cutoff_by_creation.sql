-- MUTANT purge_cutoff_by_creation (rule 10): the retention purge judges a
-- task's age by when its runs were created, not when they ended: a task made
-- long ago whose run finished just now is purged inside the retention window
-- (blind bug hunt round 4, #07).
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
                               OR r.created_at >= v_cut))  -- MUTANT: created, not ended
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

-- MUTANT cancel_keeps_prepared (rule 6): cancel stops the run but leaves its
-- prepared operations prepared: nothing forbids dispatching them later.
CREATE OR REPLACE FUNCTION fencecheck.cancel_run(p_run_id uuid, p_reason text DEFAULT 'cancelled')
RETURNS TABLE (run_status text, operations jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r public.agent_runs%ROWTYPE;
BEGIN
  SELECT * INTO r FROM public.agent_runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'FC003';
  END IF;
  IF r.status NOT IN ('succeeded', 'failed', 'cancelled') THEN
    UPDATE public.agent_runs x
       SET status = 'cancelled', owner = NULL, lease_expires_at = NULL,
           terminal_reason = p_reason, updated_at = clock_timestamp()
     WHERE x.run_id = p_run_id;
    -- MUTANT: prepared operations are not cancelled
    INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
    VALUES (gen_random_uuid(), r.tenant_id, p_run_id, 'agent.cancelled',
            jsonb_build_object('run_id', p_run_id, 'tenant_id', r.tenant_id,
                               'reason', p_reason, 'epoch', r.epoch, 'revision', r.revision));
  END IF;
  RETURN QUERY
  SELECT x.status,
         COALESCE((SELECT jsonb_agg(jsonb_build_object('operation_id', o.operation_id,
                                                       'status', o.status) ORDER BY o.operation_id)
                     FROM public.tool_operations o WHERE o.run_id = p_run_id), '[]'::jsonb)
    FROM public.agent_runs x WHERE x.run_id = p_run_id;
END
$$;

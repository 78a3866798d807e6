-- MUTANT callback_accepted_for_dead_run (rule 7): a callback converges an
-- operation in flight of a run that is terminal or no longer its task's active
-- run: a late answer moves the ledger of a cancelled or superseded run.
CREATE OR REPLACE FUNCTION fencecheck.deliver_callback(p_run_id uuid, p_operation_id text, p_payload jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  o public.tool_operations%ROWTYPE;
  v_live boolean;
  v_remote text := COALESCE(p_payload->>'resource_id', p_payload->>'remote_id');
BEGIN
  SELECT * INTO o FROM public.tool_operations x WHERE x.operation_id = p_operation_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  SELECT EXISTS (
    SELECT 1 FROM public.agent_runs r JOIN public.agent_tasks t
        ON t.tenant_id = r.tenant_id AND t.task_id = r.task_id
     WHERE r.run_id = p_run_id AND t.active_run_id = r.run_id
       AND r.status IN ('queued', 'running', 'waiting_tool')) INTO v_live;
  -- MUTANT: no check that the run is its task's active, live run
  IF o.run_id <> p_run_id OR o.status NOT IN ('dispatching', 'unknown')
     OR v_remote IS NULL THEN
    UPDATE public.tool_operations x
       SET evidence = x.evidence || jsonb_build_array(jsonb_build_object(
             'at', clock_timestamp(), 'event', 'callback_refused', 'run_id', p_run_id,
             'payload', p_payload))
     WHERE x.operation_id = p_operation_id;
    RETURN false;
  END IF;
  UPDATE public.tool_operations x
     SET status = 'succeeded', remote_id = v_remote, result = p_payload,
         dispatch_until = NULL,
         evidence = x.evidence || jsonb_build_array(jsonb_build_object(
           'at', clock_timestamp(), 'event', 'callback_accepted', 'payload', p_payload)),
         revision = x.revision + 1, updated_at = clock_timestamp()
   WHERE x.operation_id = p_operation_id;
  RETURN true;
END
$$;

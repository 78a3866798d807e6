-- A callback converges an operation only to a resource it names (contract
-- section 5, deliver_callback): an empty or blank resource_id names none.
-- 004 tested only for NULL, so {"resource_id": ""} converged the operation
-- succeeded with remote_id '' (blind hunt 66's reader; the Go reference
-- refused it).
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
  IF o.run_id <> p_run_id OR NOT v_live OR o.status NOT IN ('dispatching', 'unknown')
     OR COALESCE(btrim(v_remote), '') = '' THEN
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

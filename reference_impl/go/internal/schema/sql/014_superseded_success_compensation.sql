-- A success of a superseded run's operation asks for compensation too
-- (worker contract section 5, retry_run; English seed §9.3). 012 wrote
-- agent.compensation_required only when the run was cancelled. A run a
-- retry superseded (its task's active run is another one) has its step
-- done again by that next run under the next run's own operation id, so a
-- late success of the old run's operation is a second effect nobody wants,
-- as after a cancel. A person's convergence of a superseded run's
-- operation (G[retried_paused_in_doubt]) records the success, then ends the
-- run cancelled in the same transaction: 012 saw the run still paused.
-- The outbox guard (008) already lets the event through: it is written by
-- the transaction that made its operation succeeded.
CREATE OR REPLACE FUNCTION fencecheck.ledger_compensation() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NEW.status = 'succeeded' AND OLD.status <> 'succeeded' AND EXISTS (
       SELECT 1 FROM public.agent_runs r
        WHERE r.run_id = NEW.run_id
          AND (r.status = 'cancelled'
               OR EXISTS (SELECT 1 FROM public.agent_tasks t
                           WHERE t.tenant_id = r.tenant_id AND t.task_id = r.task_id
                             AND t.active_run_id <> r.run_id))) THEN
    INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
    VALUES (gen_random_uuid(), NEW.tenant_id, NEW.run_id, 'agent.compensation_required',
            jsonb_build_object('run_id', NEW.run_id, 'operation_id', NEW.operation_id,
                               'tool', NEW.tool_name, 'remote_id', NEW.remote_id));
  END IF;
  RETURN NULL;
END
$$;

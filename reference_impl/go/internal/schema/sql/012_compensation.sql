-- Cancel and in-flight effects (English seed §9.3; worker contract section 5
-- `cancel`): an operation of a cancelled run that becomes succeeded (a
-- worker's recorded result, a callback, an operator's convergence) asks the
-- owning service to compensate, in the same transaction: one outbox event
-- agent.compensation_required naming it. A trigger, so that every path that
-- records a success writes it; no other success does. The outbox guard
-- (008) lets it through: written by the transaction that made its operation
-- succeeded.

CREATE FUNCTION fencecheck.ledger_compensation() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NEW.status = 'succeeded' AND OLD.status <> 'succeeded' AND EXISTS (
       SELECT 1 FROM public.agent_runs r WHERE r.run_id = NEW.run_id AND r.status = 'cancelled') THEN
    INSERT INTO public.outbox (event_id, tenant_id, run_id, event_type, payload)
    VALUES (gen_random_uuid(), NEW.tenant_id, NEW.run_id, 'agent.compensation_required',
            jsonb_build_object('run_id', NEW.run_id, 'operation_id', NEW.operation_id,
                               'tool', NEW.tool_name, 'remote_id', NEW.remote_id));
  END IF;
  RETURN NULL;
END
$$;
ALTER FUNCTION fencecheck.ledger_compensation() OWNER TO fencecheck_owner;
REVOKE ALL ON FUNCTION fencecheck.ledger_compensation() FROM PUBLIC;
CREATE TRIGGER tool_operations_compensation AFTER UPDATE OF status ON public.tool_operations
  FOR EACH ROW EXECUTE FUNCTION fencecheck.ledger_compensation();

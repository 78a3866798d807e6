-- MUTANT worker_can_write_bindings (rule 12): the worker group may write
-- public.tenant_bindings (grant and policy), so a worker session can bind
-- its own login role to another tenant.
GRANT SELECT, INSERT, UPDATE, DELETE ON public.tenant_bindings TO fencecheck_worker;
CREATE POLICY worker_writes_bindings ON public.tenant_bindings FOR ALL TO fencecheck_worker
  USING (true) WITH CHECK (true);

-- MUTANT worker_can_update_runs (rule 12): the worker role may UPDATE
-- agent_runs directly, so owner, epoch, revision and status can be changed
-- around the protected-write functions (RLS still scopes it to the tenant).
GRANT UPDATE ON public.agent_runs TO fencecheck_worker;

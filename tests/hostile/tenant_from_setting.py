"""A worker whose row level security reads the tenant from a setting (contract v1).

Its policies compare tenant_id with ``current_setting('app.tenant_id')``,
which any session may set itself. `fencecheck contract` must name every
such policy (contract section 7.4) before experiment N has to.
"""

from __future__ import annotations

import os
import sys

import psycopg

from reference_impl import worker

V1_POLICIES = """
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['agent_runs', 'agent_checkpoints', 'tool_operations', 'outbox'] LOOP
    EXECUTE format('DROP POLICY tenant_isolation ON public.%I', t);
    EXECUTE format(
      'CREATE POLICY tenant_isolation ON public.%I
         USING (tenant_id = NULLIF(current_setting(''app.tenant_id'', true), '''')::uuid)', t);
  END LOOP;
END
$$;
"""

if __name__ == "__main__":
    code = worker.main()
    if code == 0 and sys.argv[1:2] == ["migrate"]:
        with psycopg.connect(os.environ["FENCECHECK_ADMIN_DSN"], autocommit=True) as conn:
            conn.execute(V1_POLICIES.encode())
    sys.exit(code)

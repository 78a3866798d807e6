"""A worker whose agent_checkpoints has a surrogate primary key of its own.

The contract allows extra columns and keys. Experiment M plants an older
checkpoint by copying the latest row: it must leave the surrogate key to the
database and pass, not end in a harness error (UniqueViolation on the key).
"""

from __future__ import annotations

import os
import sys

import psycopg

from reference_impl import worker

SURROGATE = (
    "ALTER TABLE public.agent_checkpoints DROP CONSTRAINT agent_checkpoints_pkey, "
    "ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
    "ADD UNIQUE (run_id, revision)"
)

if __name__ == "__main__":
    code = worker.main()
    if code == 0 and sys.argv[1:2] == ["migrate"]:
        with psycopg.connect(os.environ["FENCECHECK_ADMIN_DSN"], autocommit=True) as conn:
            # migrate is idempotent (M runs it a second time): only once
            has = conn.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = 'public'"
                " AND table_name = 'agent_checkpoints' AND column_name = 'id'"
            ).fetchone()
            if has is None:
                conn.execute(SURROGATE)
    sys.exit(code)

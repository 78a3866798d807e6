"""A minimal worker the harness uses to prove its own machinery (smoke run, tests).

It is not the protocol under test: it locks one row of a table in a
transaction, visits injection points while holding the lock, updates the row
and commits, recording each step in its event history. That is enough to show
a barrier holding a real row lock, SIGSTOP keeping it, and SIGKILL freeing it.

    python -m harness.parts.probe_worker TABLE ROW_ID [--linger]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import psycopg
from psycopg import sql

from harness import injection


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe_worker")
    parser.add_argument("table")
    parser.add_argument("row_id", type=int)
    parser.add_argument("--linger", action="store_true", help="sleep after committing")
    args = parser.parse_args(argv)
    dsn = os.environ.get("FENCECHECK_DSN")
    if not dsn:
        print("probe_worker: FENCECHECK_DSN is not set", file=sys.stderr)
        return 2
    with psycopg.connect(dsn) as conn:
        injection.record("invoke", "lock_row", detail={"row": args.row_id})
        conn.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(sql.Identifier(args.table)),
            [args.row_id],
        )
        injection.record("ok", "lock_row", detail={"row": args.row_id})
        injection.point("after_lease_row_locked")
        conn.execute(
            sql.SQL("UPDATE {} SET v = v + 1 WHERE id = %s").format(sql.Identifier(args.table)),
            [args.row_id],
        )
        injection.point("before_commit")
        conn.commit()
        injection.record("ok", "commit", detail={"row": args.row_id})
    while args.linger:
        time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

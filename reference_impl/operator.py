"""The operator's command line: ``python -m reference_impl.operator`` (``fencecheck-operator``).

    list                                   runs paused in doubt or for a human, with evidence
    show RUN                               one run, its operations and its audit trail
    resolve RUN OPERATION executed|not_executed [--remote-id ID]
    approve RUN | supplement RUN JSON | terminate RUN
    cancel RUN
    converge OPERATION succeeded|failed_final [--remote-id ID]
    purge --older-than-days N [--archive FILE] [--limit N]

Every decision needs ``--reason`` and takes an optional ``--ticket``; the
database writes one ``operator_actions`` row per decision (operator = the
login role, reason, ticket, the run before and after, database time). The
connection is ``FENCECHECK_DSN`` (or ``--dsn``): a login role of the group
``fencecheck_operator`` bound to the tenant (worker contract v2); a worker
role is refused by the database. Output is JSON on stdout.

Exit codes: 0 done, 1 refused (the message says why), 64 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from reference_impl import errors as e
from reference_impl import retention
from reference_impl.ops import _jsonable
from reference_impl.protocol import Protocol
from reference_impl.runs import RunControl, translated


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fencecheck-operator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dsn", default=os.environ.get("FENCECHECK_DSN"), help="operator login DSN")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="runs paused in doubt or for a human, with their evidence")
    show = sub.add_parser("show", help="one run with its operations and audit trail")
    show.add_argument("run_id")

    def decision(name: str, helptext: str) -> argparse.ArgumentParser:
        d = sub.add_parser(name, help=helptext)
        d.add_argument("--reason", required=True, help="why (kept in the audit trail)")
        d.add_argument("--ticket", help="the ticket this decision belongs to")
        return d

    r = decision("resolve", "resolve an operation in doubt; the paused run is queued again")
    r.add_argument("run_id")
    r.add_argument("operation_id")
    r.add_argument("finding", choices=["executed", "not_executed"])
    r.add_argument("--remote-id", help="the remote resource found (executed)")
    for name, what in (
        ("approve", "continue a run paused for a human as planned"),
        ("terminate", "end a paused run as failed"),
        ("cancel", "cancel a run (prepared effects forbidden, in-flight ones kept)"),
    ):
        decision(name, what).add_argument("run_id")
    s = decision("supplement", "continue a run paused for a human with supplied fields")
    s.add_argument("run_id")
    s.add_argument("fields", help="a JSON object merged into the request")
    c = decision("converge", "record the fact a person established for an unknown operation")
    c.add_argument("operation_id")
    c.add_argument("outcome", choices=["succeeded", "failed_final"])
    c.add_argument("--remote-id")
    g = decision("purge", "archive and delete old terminal runs (never runs in doubt)")
    g.add_argument("--older-than-days", type=float, required=True)
    g.add_argument("--archive", type=Path, help="JSON-lines file the runs are written to first")
    g.add_argument("--limit", type=int, default=100)
    return p


def run(args: argparse.Namespace, conn: psycopg.Connection[Any]) -> Any:
    runs = RunControl(Protocol().queries)
    cmd = args.command
    if cmd == "list":
        return runs.paused(conn)
    if cmd == "show":
        run_id = uuid.UUID(args.run_id)
        state = runs.state(conn, run_id)
        ops = translated(
            conn,
            "SELECT operation_id, step_id, effect_version, tool_name, status, remote_id, evidence"
            " FROM tool_operations WHERE run_id = %(run_id)s ORDER BY created_at",
            {"run_id": run_id},
        )
        return {"run": state, "operations": ops, "actions": runs.actions(conn, run_id)}
    if cmd == "resolve":
        return runs.resolve(
            conn,
            uuid.UUID(args.run_id),
            args.operation_id,
            args.finding,
            args.remote_id,
            args.reason,
            args.ticket,
        )
    if cmd in ("approve", "terminate"):
        return runs.decide(conn, uuid.UUID(args.run_id), cmd, None, args.reason, args.ticket)
    if cmd == "supplement":
        fields = json.loads(args.fields)
        if not isinstance(fields, dict):
            raise ValueError("the supplement is a JSON object")
        return runs.decide(
            conn, uuid.UUID(args.run_id), "supplement", fields, args.reason, args.ticket
        )
    if cmd == "cancel":
        return runs.cancel(conn, uuid.UUID(args.run_id), args.reason, args.ticket)
    if cmd == "converge":
        return runs.converge(
            conn, args.operation_id, args.outcome, args.remote_id, args.reason, args.ticket
        )
    if cmd == "purge":
        return retention.purge(
            conn, args.older_than_days * 86400.0, args.reason, args.ticket, args.archive, args.limit
        )
    raise ValueError(f"unknown command {cmd}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.dsn:
        print("fencecheck-operator: set FENCECHECK_DSN or pass --dsn", file=sys.stderr)
        return 64
    try:
        with psycopg.connect(args.dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
            out = run(args, conn)
    except (e.ProtocolError, ValueError) as exc:
        print(f"fencecheck-operator: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except psycopg.Error as exc:
        print(f"fencecheck-operator: refused by the database: {exc}", file=sys.stderr)
        return 1
    json.dump(_jsonable(out), sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

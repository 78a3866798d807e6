"""What the worker contract lets each role reach, and what the catalog says it can.

The contract (docs/worker-contract.md, "Roles, grants and tenant binding")
names the functions each group may execute and the tables a worker may
write. These lists are the harness's copy of it; experiment N holds the
database's catalog to them. The catalog is read as superuser, so nothing
here rests on a worker's word.
"""

from __future__ import annotations

from typing import Any

from harness.engine.experiment import ExperimentContext

#: Functions (schema-qualified names) the worker group may EXECUTE.
WORKER_API = frozenset(
    f"fencecheck.{name}"
    for name in (
        "session_tenant",
        "claim",
        "takeover",
        "renew",
        "release",
        "lock_lease",
        "protected_write",
        "protected_write_fast",
        "dispatch_claim",
        "record_tool_result",
        "ledger_mark_unknown",
        "ledger_return_rejected",
        "reconcile_expire_claims",
        "ledger_converge",
        "ledger_claim_retry",
        "ledger_add_evidence",
        "outbox_lock_batch",
        "outbox_mark_published",
    )
)

#: The control plane's own functions: the operator group may, the worker group
#: may never, execute them.
CONTROL_PLANE = frozenset(
    f"fencecheck.{name}"
    for name in (
        "create_run",
        "retry_run",
        "cancel_run",
        "deliver_callback",
        "operator_cancel",
        "operator_resolve",
        "operator_decide",
        "operator_converge",
        "operator_purge",
        "operator_lock_run",
    )
)

#: Functions (schema-qualified) the operator group may EXECUTE: the control
#: plane and the automatic reconciler.
OPERATOR_API = CONTROL_PLANE | frozenset(
    f"fencecheck.{name}"
    for name in (
        "session_tenant",
        "record_tool_result",
        "ledger_mark_unknown",
        "ledger_return_rejected",
        "reconcile_expire_claims",
        "ledger_converge",
        "ledger_claim_retry",
        "ledger_add_evidence",
    )
)

#: Tables the worker group may write directly (the consumer's own two); every
#: other change goes through the functions above.
WORKER_WRITABLE = frozenset({"public.consumed_events", "public.consumer_effects"})

_SYSTEM = (
    "n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%%'"
)


def tenant_tables(ctx: ExperimentContext) -> list[dict[str, Any]]:
    """Every table with a ``tenant_id`` column, with its row-level security flags."""
    return ctx.sql(
        "tables with a tenant column (catalog)",
        "SELECT format('%%I.%%I', n.nspname, c.relname) AS name, c.relrowsecurity AS rls,"
        " c.relforcerowsecurity AS forced"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id'"
        f" AND NOT a.attisdropped WHERE c.relkind IN ('r', 'p') AND {_SYSTEM} ORDER BY 1",
        [],  # parameters given, so "%%" reads as "%" as in every query here
    )


def reachable_functions(ctx: ExperimentContext, role: str) -> list[str]:
    """Functions outside the system schemas that ``role`` may call (schema USAGE
    and EXECUTE, directly or through a group it inherits)."""
    rows = ctx.sql(
        f"functions {role} can execute (catalog)",
        "SELECT DISTINCT format('%%I.%%I', n.nspname, p.proname) AS name"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        f" WHERE {_SYSTEM} AND has_schema_privilege(%s, n.oid, 'USAGE')"
        " AND has_function_privilege(%s, p.oid, 'EXECUTE') ORDER BY 1",
        [role, role],
    )
    return [str(r["name"]) for r in rows]


def reachable_sequences(ctx: ExperimentContext, role: str) -> list[dict[str, Any]]:
    """Sequences ``role`` may read or move."""
    return ctx.sql(
        f"sequences {role} can use (catalog)",
        "SELECT format('%%I.%%I', n.nspname, c.relname) AS name"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        f" WHERE c.relkind = 'S' AND {_SYSTEM}"
        # CASE: the planner may test rows of any kind before the relkind filter.
        " AND CASE WHEN c.relkind = 'S'"
        "  THEN has_sequence_privilege(%s, c.oid, 'USAGE, SELECT, UPDATE') END ORDER BY 1",
        [role],
    )


def reachable_views(ctx: ExperimentContext, role: str) -> list[dict[str, Any]]:
    """Views ``role`` may read, with whether they carry a tenant column and run
    with the invoker's rights (so the tables' policies apply to the reader)."""
    return ctx.sql(
        f"views {role} can read (catalog)",
        "SELECT format('%%I.%%I', n.nspname, c.relname) AS name,"
        " EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid"
        "         AND a.attname = 'tenant_id' AND NOT a.attisdropped) AS has_tenant,"
        " coalesce('security_invoker=true' = ANY (c.reloptions), false) AS invoker"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        f" WHERE c.relkind IN ('v', 'm') AND {_SYSTEM}"
        " AND has_schema_privilege(%s, n.oid, 'USAGE')"
        " AND has_table_privilege(%s, c.oid, 'SELECT') ORDER BY 1",
        [role, role],
    )


def writable_tables(ctx: ExperimentContext, role: str) -> list[str]:
    """Tables ``role`` may INSERT into, UPDATE, DELETE from or TRUNCATE."""
    rows = ctx.sql(
        f"tables {role} can write (catalog)",
        "SELECT format('%%I.%%I', n.nspname, c.relname) AS name"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        f" WHERE c.relkind IN ('r', 'p') AND {_SYSTEM}"
        " AND has_schema_privilege(%s, n.oid, 'USAGE')"
        " AND has_table_privilege(%s, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE') ORDER BY 1",
        [role, role],
    )
    return [str(r["name"]) for r in rows]


def creatable_schemas(ctx: ExperimentContext, role: str) -> list[str]:
    """Schemas ``role`` may create objects in (where it could plant a function)."""
    rows = ctx.sql(
        f"schemas {role} can create in (catalog)",
        f"SELECT n.nspname AS name FROM pg_namespace n WHERE {_SYSTEM}"
        " AND has_schema_privilege(%s, n.oid, 'CREATE') ORDER BY 1",
        [role],
    )
    return [str(r["name"]) for r in rows]

"""The contract's schema (``schema.sql``) against a worker's database, from the catalogs.

The expected side is never a list kept in Python: ``schema.sql`` is applied
to an empty scratch database of the same server and its catalog is read
back, so the DDL a worker may apply and what the check demands are one file.

Invariants:
- every table of ``schema.sql`` must exist in the worker's database with
  every column of it, of the same type and the same nullability; every key
  of it (primary key or unique constraint) must be a unique index of the
  worker's on exactly those columns (a primary key, a unique constraint or
  a unique index without predicate: a surrogate key of the worker's own is
  allowed next to it);
- every table with a ``tenant_id`` column has row level security enabled and
  forced, and a policy that reads the session's tenant from
  ``fencecheck.session_tenant()``; no policy of it reads a setting;
- the group roles exist, cannot log in, and have none of the attributes
  that would bypass the policies; neither is a member of the other;
- extra tables, columns, keys, indexes and constraints are never a gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract.report import Gap
from harness.parts.postgres import PostgresCluster

SCHEMA_SQL = Path(__file__).parent / "schema.sql"
GROUP_ROLES = ("fencecheck_worker", "fencecheck_operator")
BINDINGS = "tenant_bindings"
#: Tables of schema.sql a worker need not have, with what depends on them.
OPTIONAL_TABLES = {
    "operator_actions": "only the optional control-plane ops resolve_indoubt, decide and "
    "converge_operation write it (J[operator_resolves] reads it)",
}
_ROLE_FLAGS = ("rolcanlogin", "rolsuper", "rolcreatedb", "rolcreaterole", "rolbypassrls")


@dataclass(frozen=True)
class Column:
    type: str
    not_null: bool


@dataclass
class Table:
    name: str
    columns: dict[str, Column] = field(default_factory=dict)
    keys: set[frozenset[str]] = field(default_factory=set)
    rls: bool = False
    forced: bool = False
    policies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tenant_scoped(self) -> bool:
        return "tenant_id" in self.columns


@dataclass
class Catalog:
    """What one database says about the contract's objects."""

    tables: dict[str, Table]
    roles: dict[str, dict[str, Any]]
    memberships: set[tuple[str, str]]
    session_tenant: list[dict[str, Any]]


def read_catalog(cluster: PostgresCluster, dbname: str) -> Catalog:
    """Tables of schema ``public`` with columns, unique keys, RLS and policies;
    the group roles; ``fencecheck.session_tenant`` overloads. As superuser."""

    def q(statement: str, params: Any = None) -> list[dict[str, Any]]:
        return cluster.query(statement, params, dbname=dbname)

    tables: dict[str, Table] = {}
    for r in q(
        "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
    ):
        tables[r["relname"]] = Table(
            r["relname"], rls=r["relrowsecurity"], forced=r["relforcerowsecurity"]
        )
    for r in q(
        "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND a.attnum > 0 "
        "AND NOT a.attisdropped"
    ):
        tables[r["relname"]].columns[r["attname"]] = Column(r["type"], r["attnotnull"])
    for r in q(
        "SELECT c.relname, array_agg(a.attname::text) AS cols FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY (i.indkey) "
        "WHERE n.nspname = 'public' AND i.indisunique AND i.indpred IS NULL "
        "AND i.indexprs IS NULL GROUP BY c.relname, i.indexrelid"
    ):
        tables[r["relname"]].keys.add(frozenset(r["cols"]))
    for r in q(
        "SELECT tablename, policyname, cmd, coalesce(qual, '') AS qual, "
        "coalesce(with_check, '') AS with_check FROM pg_policies WHERE schemaname = 'public'"
    ):
        tables[r["tablename"]].policies.append(r)
    roles = {
        r["rolname"]: r
        for r in q(
            f"SELECT rolname, {', '.join(_ROLE_FLAGS)} FROM pg_roles WHERE rolname = ANY (%s)",
            [list(GROUP_ROLES)],
        )
    }
    memberships = {
        (r["member"], r["grp"])
        for r in q(
            "SELECT m.rolname AS member, g.rolname AS grp FROM pg_auth_members am "
            "JOIN pg_roles m ON m.oid = am.member JOIN pg_roles g ON g.oid = am.roleid "
            "WHERE m.rolname = ANY (%s) AND g.rolname = ANY (%s)",
            [list(GROUP_ROLES), list(GROUP_ROLES)],
        )
    }
    session_tenant = q(
        "SELECT pg_get_function_identity_arguments(p.oid) AS args, "
        "format_type(p.prorettype, NULL) AS returns, p.prosecdef AS security_definer "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'fencecheck' AND p.proname = 'session_tenant'"
    )
    return Catalog(tables, roles, memberships, session_tenant)


def expected_catalog(cluster: PostgresCluster) -> Catalog:
    """Apply ``schema.sql`` to a scratch database of ``cluster`` and read it back."""
    scratch = cluster.create_database(prefix="fc_contract_expected")
    try:
        cluster.query(SCHEMA_SQL.read_text(encoding="utf-8"), dbname=scratch.name)
        return read_catalog(cluster, scratch.name)
    finally:
        cluster.drop_database(scratch.name)


def _columns_text(cols: frozenset[str]) -> str:
    return "(" + ", ".join(sorted(cols)) + ")"


def compare(expected: Catalog, found: Catalog) -> tuple[list[Gap], list[str]]:
    """Gaps of ``found`` against ``expected``, and notes (allowed differences)."""
    gaps: list[Gap] = []
    notes: list[str] = []
    for name, want in sorted(expected.tables.items()):
        have = found.tables.get(name)
        if have is None:
            if name in OPTIONAL_TABLES:
                notes.append(f"optional table public.{name} absent: {OPTIONAL_TABLES[name]}")
                continue
            gaps.append(Gap("6", f"table public.{name}", "present (schema.sql)", "missing"))
            continue
        gaps.extend(_table_gaps(want, have))
    gaps.extend(_isolation_gaps(found))
    gaps.extend(_role_gaps(found))
    gaps.extend(_session_tenant_gaps(found))
    return gaps, notes


def _table_gaps(want: Table, have: Table) -> list[Gap]:
    gaps: list[Gap] = []
    for col, spec in want.columns.items():
        got = have.columns.get(col)
        wanted = f"{spec.type}{' NOT NULL' if spec.not_null else ''}"
        if got is None:
            gaps.append(Gap("6", f"column {want.name}.{col}", wanted, "missing"))
        elif (got.type, got.not_null) != (spec.type, spec.not_null):
            gaps.append(
                Gap(
                    "6",
                    f"column {want.name}.{col}",
                    wanted,
                    f"{got.type}{' NOT NULL' if got.not_null else ' (nullable)'}",
                )
            )
    for key in sorted(want.keys, key=sorted):
        if key not in have.keys and key <= set(have.columns):
            gaps.append(
                Gap(
                    "6",
                    f"key of {want.name}",
                    f"unique {_columns_text(key)} (primary key, unique constraint or index)",
                    "unique keys: "
                    + (", ".join(sorted(_columns_text(k) for k in have.keys)) or "none"),
                )
            )
    return gaps


def _isolation_gaps(found: Catalog) -> list[Gap]:
    gaps: list[Gap] = []
    for name, t in sorted(found.tables.items()):
        if not t.tenant_scoped:
            continue
        if not (t.rls and t.forced):
            gaps.append(
                Gap(
                    "7.4",
                    f"row level security of public.{name}",
                    "enabled and forced",
                    f"enabled={t.rls}, forced={t.forced}",
                )
            )
        if name == BINDINGS:
            continue  # its own policy keys on role_name (section 7.2)
        reading = [
            p
            for p in t.policies
            if p["cmd"] in ("ALL", "SELECT") and "session_tenant()" in p["qual"]
        ]
        settings = [
            p["policyname"] for p in t.policies if "current_setting" in p["qual"] + p["with_check"]
        ]
        if not reading or settings:
            gaps.append(
                Gap(
                    "7.4",
                    f"policies of public.{name}",
                    "a policy for reading whose USING compares tenant_id with "
                    "fencecheck.session_tenant(); none reading a setting",
                    "; ".join(f"{p['policyname']} ({p['cmd']}): {p['qual']}" for p in t.policies)
                    or "no policy",
                )
            )
    return gaps


def _role_gaps(found: Catalog) -> list[Gap]:
    gaps: list[Gap] = []
    for role in GROUP_ROLES:
        attrs = found.roles.get(role)
        if attrs is None:
            gaps.append(Gap("7.1", f"group role {role}", "created by migrate", "missing"))
            continue
        bad = [flag for flag in _ROLE_FLAGS if attrs[flag]]
        if bad:
            gaps.append(
                Gap(
                    "7.1",
                    f"group role {role}",
                    "NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS",
                    "has " + ", ".join(bad),
                )
            )
    for member, group in sorted(found.memberships):
        gaps.append(
            Gap("7.1", f"group role {member}", "a member of no other group", f"member of {group}")
        )
    return gaps


def _session_tenant_gaps(found: Catalog) -> list[Gap]:
    shapes = [(f["args"], f["returns"]) for f in found.session_tenant]
    if ("", "uuid") in shapes:
        return []
    return [
        Gap(
            "7.3",
            "function fencecheck.session_tenant()",
            "no argument, returns uuid",
            ", ".join(f"session_tenant({a}) returns {r}" for a, r in shapes) or "missing",
        )
    ]

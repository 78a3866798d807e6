"""Install the model into a migrated database: its views and the audit trail.

Called once per template (after the worker's ``migrate``) and read by every
experiment database made from it. What the mapping names is checked against
the database's own catalog first, so a mapping that names a table or a
column the system does not have is reported by its field, never as a later
SQL error in an experiment.

Invariants: nothing is installed unless every table and column the mapping
names exists (:func:`problems` lists those that do not); installing twice
is the same as once; the lease duration a mapping's ``plus_ms: lease_ttl``
reads is set per experiment database (:func:`set_lease_ttl`), before any
worker of it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from harness.model import compile
from harness.model.spec import (
    OPTIONAL,
    Column,
    Expr,
    LastOf,
    Lookup,
    ModelMap,
    PlusMs,
    Relation,
    Values,
)

Query = Callable[[str, Sequence[Any] | None], list[dict[str, Any]]]


def _catalog(conn: psycopg.Connection[Any]) -> dict[str, set[str]]:
    rows = conn.execute(
        "SELECT table_schema || '.' || table_name AS t, column_name AS c "
        "FROM information_schema.columns "
        "WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
    ).fetchall()
    out: dict[str, set[str]] = {}
    for table, column in rows:
        out.setdefault(str(table), set()).add(str(column))
    return out


def _columns_of(e: Expr) -> list[tuple[str | None, str]]:
    """(lookup table or None for the relation's own, column) an expression reads."""
    if isinstance(e, Column):
        return [(None, e.name)]
    if isinstance(e, Values):
        return [(None, e.column)]
    if isinstance(e, LastOf):
        return [(None, e.column)]
    if isinstance(e, Lookup):
        return [(None, e.via), (e.table, e.key), (e.table, e.column)]
    if isinstance(e, PlusMs):
        return _columns_of(e.of)
    return []


@dataclass(frozen=True)
class Problem:
    """Something the mapping names that the database lacks, by its field."""

    field: str
    text: str
    #: The table that is missing, when that is the problem.
    table: str | None = None

    def __str__(self) -> str:
        return f"{self.field}: {self.text}"


def problems(model: ModelMap, catalog: dict[str, set[str]]) -> list[Problem]:
    """What the mapping names that the database lacks, each by its field."""
    out: list[Problem] = []
    for name, rel in model.relations.items():
        if rel is None:
            continue
        where = f"model.{name}"
        if rel.table not in catalog:
            if not (rel.same_names and name in OPTIONAL):
                out.append(Problem(f"{where}.table", f"no table {rel.table}", rel.table))
            continue
        if rel.same_names:
            continue
        for column, e in rel.columns.items():
            for table, col in _columns_of(e):
                have = catalog.get(table or rel.table)
                field = f"{where}.columns.{column}"
                if have is None:
                    out.append(Problem(field, f"no table {table}", table))
                elif col not in have:
                    out.append(Problem(field, f"{table or rel.table} has no column {col}"))
        log = rel.deleted.log if rel.deleted is not None else None
        if log is not None:
            field = f"{where}.deleted.log"
            have = catalog.get(log.table)
            if have is None:
                out.append(Problem(f"{field}.table", f"no table {log.table}", log.table))
                continue
            for key in ("key", "column", "latest"):
                col = getattr(log, key)
                if col is not None and col not in have:
                    out.append(Problem(f"{field}.{key}", f"{log.table} has no column {col}"))
    return out


def install(conn: psycopg.Connection[Any], model: ModelMap) -> list[Problem]:
    """Install the model (views, audit trail) into the database of ``conn``
    (a superuser's, autocommit); the problems instead when there are any."""
    catalog = _catalog(conn)
    found = problems(model, catalog)
    if found:
        return found
    conn.execute(compile.install_sql(model, catalog).encode())
    return []


def set_lease_ttl(query: Query, lease_ttl_ms: int) -> None:
    """The experiment's lease duration, for mappings whose expiry is a duration
    after a time of the system's (``plus_ms: lease_ttl``)."""
    query(f"DELETE FROM {compile.SETTINGS}", None)
    query(f"INSERT INTO {compile.SETTINGS} (lease_ttl_ms) VALUES (%s)", [lease_ttl_ms])


def relation_of(model: ModelMap, name: str) -> Relation | None:
    return model.relations.get(name)

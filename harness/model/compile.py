"""The model as SQL: one view per relation, one audit trigger per base table.

Invariants:
- the view of a relation and the rows its trigger records are computed by
  the same compiled SELECT (:func:`model_select`), so what a checker reads
  live and what the audit trail says a change did can never disagree;
- a same-named relation's view is its table as it is (``SELECT *``, so it
  stays updatable for the harness's own plants) and its trigger records the
  whole row as before; a mapped relation's view has exactly the model's
  columns, each cast to the model's type, the lease columns cleared outside
  the holding statuses;
- a change of a lookup table (a worker's heartbeat row) is recorded as an
  UPDATE of every run whose model row it changed, with the session, time and
  statement of that change; a change that moves no run records nothing;
- every name is quoted and schema-qualified, every trigger function is
  SECURITY DEFINER with ``search_path`` pinned, and the worker roles get no
  right on either schema.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from harness.model.entities import COLUMNS, HOLDING, LEASE_COLUMNS, SCHEMA, TERMINAL
from harness.model.spec import (
    Column,
    Expr,
    LastOf,
    Lookup,
    ModelMap,
    PlusMs,
    Relation,
    Values,
)

AUDIT = "fencecheck_audit"
SETTINGS = f"{SCHEMA}.settings"
#: Which model columns the mapping gives a value (relation, column): a column
#: mapped to ``none`` reads as null, and an invariant must not take a system
#: without the column for one whose column is never written.
DECLARED = f"{SCHEMA}.declared"
#: The last model row of every run whose row the system deleted (``deleted:``).
DELETED_RUNS = f"{AUDIT}.deleted_runs"
#: How much of the client's top-level statement is kept per change: enough to
#: tell a worker's write paths apart (section "Write paths" of the contract).
STATEMENT_CHARS = 400
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")


def ident(name: str) -> str:
    """``name`` as a quoted identifier (a dotted name part by part)."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def literal(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + value.replace("'", "''") + "'"


def _lookup_alias(rel: Relation, lk: Lookup) -> str:
    return f"l{rel.lookups().index(lk) + 1}"


def expr_sql(rel: Relation, e: Expr) -> str:
    """One value over base row ``r`` and lookup rows ``l1``, ``l2``, ..."""
    if e is None:
        return "NULL"
    if isinstance(e, Column):
        return f"r.{ident(e.name)}"
    if isinstance(e, Values):
        cases = " ".join(f"WHEN {literal(k)} THEN {literal(v)}" for k, v in e.values)
        col = f"r.{ident(e.column)}::text"
        return f"(CASE {col} {cases} ELSE {col} END)"
    if isinstance(e, LastOf):
        col = f"r.{ident(e.column)}"
        return f"{col}[array_upper({col}, 1)]"
    if isinstance(e, Lookup):
        for lk in rel.lookups():
            if (lk.table, lk.key, lk.via) == (e.table, e.key, e.via):
                return f"{_lookup_alias(rel, lk)}.{ident(e.column)}"
        raise AssertionError(e)
    if isinstance(e, PlusMs):
        ms = f"(SELECT lease_ttl_ms FROM {SETTINGS})" if e.ms is None else str(e.ms)
        return f"(({expr_sql(rel, e.of)})::timestamptz + {ms} * interval '1 millisecond')"
    return literal(e.value)


def columns_sql(rel: Relation) -> str:
    """The model's columns of ``rel``, typed, the lease cleared outside HOLDING."""
    status = expr_sql(rel, rel.expr("status")) if rel.name == "agent_runs" else ""
    holding = ", ".join(literal(s) for s in HOLDING)
    out = []
    for column, sql_type in COLUMNS[rel.name].items():
        value = f"({expr_sql(rel, rel.expr(column))})::{sql_type}"
        if rel.name == "agent_runs" and column in LEASE_COLUMNS:
            value = f"(CASE WHEN ({status})::text IN ({holding}) THEN {value} END)"
        out.append(f"{value} AS {ident(column)}")
    return ", ".join(out)


def model_select(rel: Relation, source: str, lookup_sources: dict[str, str] | None = None) -> str:
    """The model rows of ``rel`` from base rows ``source`` (a table or ``(SELECT
    NEW.*)``); ``lookup_sources`` replaces a lookup table by another source (the
    row a lookup trigger sees before or after its change)."""
    joins = []
    for lk in rel.lookups():
        src = (lookup_sources or {}).get(lk.table, lk.table)
        src = src if src.startswith("(") else ident(src)
        alias = _lookup_alias(rel, lk)
        joins.append(f"LEFT JOIN {src} {alias} ON {alias}.{ident(lk.key)} = r.{ident(lk.via)}")
    return f"SELECT {columns_sql(rel)} FROM {source} r {' '.join(joins)}".strip()


def view_sql(name: str, rel: Relation | None) -> str:
    """The view of one model relation; an empty one of its shape when absent."""
    target = f"{SCHEMA}.{ident(name)}"
    if rel is None:
        empty = ", ".join(f"NULL::{t} AS {ident(c)}" for c, t in COLUMNS[name].items())
        return f"CREATE VIEW {target} AS SELECT {empty} WHERE false;"
    if rel.same_names:
        return f"CREATE VIEW {target} AS SELECT * FROM {ident(rel.table)};"
    live = model_select(rel, ident(rel.table))
    if rel.deleted is None:
        return f"CREATE VIEW {target} AS {live};"
    columns = ", ".join(f"g.{ident(c)}" for c in COLUMNS[name])
    run_id = expr_sql(rel, rel.expr("run_id"))
    return (
        f"CREATE VIEW {target} AS {live} UNION ALL SELECT {columns} FROM {DELETED_RUNS} g "
        f"WHERE NOT EXISTS (SELECT 1 FROM {ident(rel.table)} r WHERE ({run_id})::text = g.run_id);"
    )


def deleted_runs_sql() -> str:
    """The table of deleted runs' last model rows: the model's run columns."""
    columns = ", ".join(f"{ident(c)} {t}" for c, t in COLUMNS["agent_runs"].items())
    return (
        f"CREATE TABLE IF NOT EXISTS {DELETED_RUNS} ({columns});\n"
        f"REVOKE ALL ON {DELETED_RUNS} FROM PUBLIC;"
    )


def _deleted_status_sql(rel: Relation) -> str:
    """PL/pgSQL setting ``st`` to the status a deleted run ``o`` ended with: its
    log's newest row mapped, when that is terminal, else the mapping's own."""
    assert rel.deleted is not None
    terminal = ", ".join(literal(s) for s in TERMINAL)
    out = "  st := NULL;\n"
    log = rel.deleted.log
    if log is not None:
        col = f"l.{ident(log.column)}::text"
        cases = " ".join(f"WHEN {literal(k)} THEN {literal(v)}" for k, v in log.values)
        value = f"(CASE {col} {cases} ELSE {col} END)" if cases else col
        order = f" ORDER BY l.{ident(log.latest)} DESC" if log.latest else ""
        out += (
            f"  SELECT {value} INTO st FROM {ident(log.table)} l\n"
            f"   WHERE l.{ident(log.key)}::text = o->>'run_id'{order} LIMIT 1;\n"
        )
    out += (
        f"  IF st IS NULL OR st NOT IN ({terminal}) THEN\n"
        f"    st := {literal(rel.deleted.status)};\n"
        "  END IF;\n"
    )
    return out


AUDIT_TABLE = f"""
CREATE SCHEMA IF NOT EXISTS {AUDIT};
REVOKE ALL ON SCHEMA {AUDIT} FROM PUBLIC;
CREATE TABLE IF NOT EXISTS {AUDIT}.changes (
  seq bigserial PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  tx_start timestamptz NOT NULL DEFAULT now(),
  txid bigint NOT NULL DEFAULT txid_current(),
  app text NOT NULL DEFAULT current_setting('application_name'),
  db_user text NOT NULL DEFAULT session_user,
  statement text DEFAULT left(current_query(), {STATEMENT_CHARS}),
  tbl text NOT NULL,
  op text NOT NULL,
  old jsonb,
  new jsonb,
  base_tbl text,
  base_old jsonb,
  base_new jsonb
);
REVOKE ALL ON {AUDIT}.changes FROM PUBLIC;
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
REVOKE ALL ON SCHEMA {SCHEMA} FROM PUBLIC;
CREATE TABLE IF NOT EXISTS {SETTINGS} (lease_ttl_ms bigint);
REVOKE ALL ON {SETTINGS} FROM PUBLIC;
"""

_FUNCTION = """
CREATE OR REPLACE FUNCTION {name}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $fc$
{body}
$fc$;
DROP TRIGGER IF EXISTS {trigger} ON {table};
CREATE TRIGGER {trigger} AFTER INSERT OR UPDATE OR DELETE ON {table}
  FOR EACH ROW EXECUTE FUNCTION {name}();
"""


def _function_name(kind: str, table: str) -> str:
    safe = re.sub(r"[^a-z0-9_]", "_", table.lower())
    return f"{AUDIT}.{kind}_{safe}"


def relation_trigger_sql(rel: Relation) -> str:
    """The trigger on a relation's own table: each row change as model rows."""
    table = ident(rel.table)
    if rel.same_names:
        body = f"""BEGIN
  INSERT INTO {AUDIT}.changes (tbl, op, old, new, base_tbl)
  VALUES ({literal(rel.name)}, TG_OP,
          CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
          CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END, TG_TABLE_NAME);
  RETURN NULL;
END"""
    else:
        ended = ""
        if rel.deleted is not None:
            ended = f"""  IF TG_OP = 'DELETE' THEN
{_deleted_status_sql(rel)}    n := o || jsonb_build_object('status', st, 'owner', NULL, 'lease_expires_at', NULL);
    DELETE FROM {DELETED_RUNS} WHERE run_id = o->>'run_id';
    INSERT INTO {DELETED_RUNS} SELECT * FROM jsonb_populate_record(NULL::{DELETED_RUNS}, n);
    INSERT INTO {AUDIT}.changes (tbl, op, old, new, base_tbl, base_old, base_new)
    VALUES ({literal(rel.name)}, 'UPDATE', o, n, TG_TABLE_NAME, to_jsonb(OLD), NULL);
    RETURN NULL;
  END IF;
"""
        # st: the status a deleted run ended with (declared only where one can be).
        st = "  st text;\n" if rel.deleted is not None else ""
        body = f"""DECLARE
  o jsonb;
  n jsonb;
{st}BEGIN
  IF TG_OP <> 'INSERT' THEN
    SELECT to_jsonb(m) INTO o FROM ({model_select(rel, "(SELECT OLD.*)")}) m;
  END IF;
{ended}  IF TG_OP <> 'DELETE' THEN
    SELECT to_jsonb(m) INTO n FROM ({model_select(rel, "(SELECT NEW.*)")}) m;
  END IF;
  INSERT INTO {AUDIT}.changes (tbl, op, old, new, base_tbl, base_old, base_new)
  VALUES ({literal(rel.name)}, TG_OP, o, n, TG_TABLE_NAME,
          CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
          CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END);
  RETURN NULL;
END"""
    trigger = ident("fencecheck_audit")
    return _FUNCTION.format(
        name=_function_name(f"on_{rel.name}", rel.table), body=body, trigger=trigger, table=table
    )


def lookup_trigger_sql(rel: Relation, lookup_table: str) -> str:
    """The trigger on a table ``rel`` looks up (a heartbeat row): every run of
    ``rel`` whose model row that change moved, recorded as its UPDATE."""
    vias = sorted({lk for lk in rel.lookups() if lk.table == lookup_table}, key=str)
    where = " OR ".join(
        f"r.{ident(lk.via)} IN (OLD.{ident(lk.key)}, NEW.{ident(lk.key)})" for lk in vias
    )
    before = model_select(rel, "(SELECT rec.*)", {lookup_table: "(SELECT OLD.*)"})
    after = model_select(rel, "(SELECT rec.*)", {lookup_table: "(SELECT NEW.*)"})
    body = f"""DECLARE
  rec {ident(rel.table)}%ROWTYPE;
  o jsonb;
  n jsonb;
BEGIN
  FOR rec IN SELECT * FROM {ident(rel.table)} r WHERE {where} LOOP
    SELECT to_jsonb(m) INTO o FROM ({before}) m;
    SELECT to_jsonb(m) INTO n FROM ({after}) m;
    IF o IS DISTINCT FROM n THEN
      INSERT INTO {AUDIT}.changes (tbl, op, old, new, base_tbl, base_old, base_new)
      VALUES ({literal(rel.name)}, 'UPDATE', o, n, TG_TABLE_NAME,
              CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
              CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END);
    END IF;
  END LOOP;
  RETURN NULL;
END"""
    return _FUNCTION.format(
        name=_function_name(f"via_{rel.name}", lookup_table),
        body=body,
        trigger=ident(f"fencecheck_audit_{rel.name}"),
        table=ident(lookup_table),
    )


def declared_columns(model: ModelMap, catalog: Mapping[str, set[str]]) -> dict[str, list[str]]:
    """The model columns each relation gives a value: a same-named relation the
    contract's columns its table has, a mapped one those not mapped to none;
    ``catalog`` is table -> its columns."""
    out: dict[str, list[str]] = {}
    for name, rel in model.relations.items():
        if rel is None or rel.table not in catalog:
            out[name] = []
        elif rel.same_names:
            out[name] = [c for c in COLUMNS[name] if c in catalog[rel.table]]
        else:
            out[name] = [c for c in COLUMNS[name] if rel.expr(c) is not None]
    return out


def declared_sql(declared: Mapping[str, list[str]]) -> str:
    rows = ", ".join(
        f"({literal(name)}, {literal(c)})" for name, cols in declared.items() for c in cols
    )
    insert = f"INSERT INTO {DECLARED} VALUES {rows};" if rows else ""
    return (
        f"CREATE TABLE IF NOT EXISTS {DECLARED} (relation text, column_name text, "
        f"PRIMARY KEY (relation, column_name));\nREVOKE ALL ON {DECLARED} FROM PUBLIC;\n"
        f"TRUNCATE {DECLARED};\n{insert}"
    )


def install_sql(model: ModelMap, catalog: Mapping[str, set[str]]) -> str:
    """Everything the harness adds after ``migrate``: the audit table, the model's
    schema and views, the triggers, and the declared columns; ``catalog`` is
    every base table that exists with its columns (a same-named optional
    relation without its table is an empty view)."""
    present = set(catalog)
    parts = [AUDIT_TABLE, declared_sql(declared_columns(model, catalog))]
    for name, rel in model.relations.items():
        usable = rel if rel is None or rel.table in present else None
        parts.append(f"DROP VIEW IF EXISTS {SCHEMA}.{ident(name)};")
        if usable is not None and usable.deleted is not None:
            parts.append(deleted_runs_sql())
        parts.append(view_sql(name, usable))
        if usable is None:
            continue
        parts.append(relation_trigger_sql(usable))
        for table in dict.fromkeys(lk.table for lk in usable.lookups()):
            parts.append(lookup_trigger_sql(usable, table))
    parts.append(
        f"""-- The lease history in the columns the scenarios read (owner, epoch,
-- revision, status, expiry, before and after each change of a run).
CREATE OR REPLACE VIEW {AUDIT}.run_changes AS
SELECT seq, at, txid, app, op,
       coalesce(new, old)->>'run_id' AS run_id,
       new->>'status' AS status, new->>'owner' AS owner,
       (new->>'epoch')::bigint AS epoch, (new->>'revision')::bigint AS revision,
       (new->>'lease_expires_at')::timestamptz AS lease_expires_at,
       old->>'status' AS old_status, old->>'owner' AS old_owner,
       (old->>'epoch')::bigint AS old_epoch, (old->>'revision')::bigint AS old_revision,
       (old->>'lease_expires_at')::timestamptz AS old_lease_expires_at
  FROM {AUDIT}.changes WHERE tbl = 'agent_runs';
REVOKE ALL ON {AUDIT}.run_changes FROM PUBLIC;"""
    )
    return "\n".join(parts)


def name_ok(name: str) -> bool:
    return all(_NAME.match(p) for p in name.split("."))

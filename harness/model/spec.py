"""The ``model:`` section of a mapping: which of a system's tables, columns or
expressions is each column of each model relation (contract section 14).

A relation is one of:

* ``none``: the system has no such thing (an empty view of the model's shape);
* ``{table: T, same_names: true}``: table ``T`` has the contract's columns under
  the contract's names (the reference workers; the contract's default);
* ``{table: T, columns: {model column: value}}``: every other column is null.

A value is a column name, ``none``, or one of ``{column: C, values: {system
value: model value}}`` (an enumeration mapped, e.g. statuses), ``{last_of: C}``
(the last element of an array column), ``{lookup: T2, key: K, via: C, column:
X}`` (column X of the row of T2 whose K equals this row's C: a worker's
heartbeat row), ``{plus_ms: N | lease_ttl, of: VALUE}`` (a time plus a
duration; ``lease_ttl`` is the experiment's lease duration), ``{const: V}``.
That is enough to say "the lease expires one lease duration after the
worker's last heartbeat" or "the owner is the last client in attempted_by"
in database time, and little enough that the harness compiles it to one view
and one trigger per table without running any SQL of the system's.

The runs relation may also say what a DELETE of its row means (``deleted:``):
the run ended, with a fixed terminal ``status``, or the status read from
the newest row of a ``log`` table the mapping names, keyed by the run's id
(a queue that moves its finished jobs into a log table, like pgqueuer). The
harness then keeps the run in the model (terminal, no owner, no lease) and
audits the DELETE as the run's move to that status.

Invariants: a section that is not valid raises :class:`ModelError` listing
every problem by its path (``model.agent_runs.columns.owner``); an absent
section is the contract's own schema (every relation ``same_names`` on the
table of its name); a lookup names its own table, so the audit trigger knows
which tables move a run without being told twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.model.entities import COLUMNS, RELATIONS, STATUSES, TERMINAL

#: Model relations a contract-schema worker may leave out (an optional table).
OPTIONAL = ("operator_actions",)


class ModelError(ValueError):
    """The ``model:`` section cannot be used; every problem names its path."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class Column:
    name: str


@dataclass(frozen=True)
class Values:
    """An enumeration column mapped onto the model's values (others kept as they are)."""

    column: str
    values: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class LastOf:
    column: str


@dataclass(frozen=True)
class Lookup:
    table: str
    key: str
    via: str
    column: str


@dataclass(frozen=True)
class PlusMs:
    """``of`` plus ``ms`` milliseconds; ``ms`` None: the experiment's lease duration."""

    of: Expr
    ms: int | None


@dataclass(frozen=True)
class Const:
    value: str | int | float | bool


Expr = Column | Values | LastOf | Lookup | PlusMs | Const | None


@dataclass(frozen=True)
class DeletedLog:
    """Where a deleted run's final status is read: column ``column`` of the newest
    row (by ``latest``; any row without it) of ``table`` whose ``key`` is the run's
    id, mapped by ``values``."""

    table: str  # schema-qualified
    key: str
    column: str
    latest: str | None = None
    values: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Deleted:
    """A DELETE of a run's row ends the run: with ``status`` (terminal), unless
    ``log`` has a row of it that maps onto another terminal status."""

    status: str
    log: DeletedLog | None = None


@dataclass(frozen=True)
class Relation:
    """How one model relation reads from the system: its table and its columns."""

    name: str
    table: str  # schema-qualified
    same_names: bool = False
    columns: Mapping[str, Expr] = field(default_factory=dict)
    #: agent_runs only: what a DELETE of its row means (None: nothing; a DELETE
    #: then removes the run from the model, which the invariants read as a break).
    deleted: Deleted | None = None

    def expr(self, column: str) -> Expr:
        return self.columns.get(column)

    def lookups(self) -> list[Lookup]:
        """Every lookup of its columns, once each (by table, key and via column)."""
        found: dict[tuple[str, str, str], Lookup] = {}
        for e in self.columns.values():
            for lk in _lookups(e):
                found.setdefault((lk.table, lk.key, lk.via), lk)
        return list(found.values())


@dataclass(frozen=True)
class ModelMap:
    """The whole ``model:`` section: each relation mapped, or None (absent)."""

    relations: Mapping[str, Relation | None]

    def base_tables(self) -> list[str]:
        """Every table the model reads, its relations' and their lookups'."""
        tables: dict[str, None] = {}
        for rel in self.relations.values():
            if rel is not None:
                tables[rel.table] = None
                for lk in rel.lookups():
                    tables[lk.table] = None
                if rel.deleted is not None and rel.deleted.log is not None:
                    tables[rel.deleted.log.table] = None
        return list(tables)

    def maps(self, relation: str, column: str) -> bool:
        """Whether the system has a value for ``column`` of ``relation``."""
        rel = self.relations.get(relation)
        return rel is not None and (rel.same_names or rel.expr(column) is not None)

    @property
    def identity(self) -> bool:
        """The contract's own schema: every present relation same-named."""
        return all(r is None or r.same_names for r in self.relations.values())


def _lookups(e: Expr) -> list[Lookup]:
    if isinstance(e, Lookup):
        return [e]
    if isinstance(e, PlusMs):
        return _lookups(e.of)
    return []


def qualified(table: str) -> str:
    return table if "." in table else f"public.{table}"


def contract_default() -> ModelMap:
    """The contract's own schema: each relation the table of its name."""
    return ModelMap({name: Relation(name, f"public.{name}", same_names=True) for name in RELATIONS})


def parse(section: Mapping[str, Any] | None) -> ModelMap:
    """The ``model:`` section as a ModelMap; ModelError naming every problem."""
    if not section:
        return contract_default()
    problems: list[str] = []
    if not isinstance(section, Mapping):
        raise ModelError(["model: a mapping of relation names was expected"])
    unknown = sorted(set(section) - set(RELATIONS))
    problems += [
        f"model.{u}: not a relation of the model ({', '.join(RELATIONS)})" for u in unknown
    ]
    relations: dict[str, Relation | None] = {}
    for name in RELATIONS:
        raw = section.get(name)
        path = f"model.{name}"
        if raw is None or raw == "none":
            if name == "agent_runs":
                problems.append(f"{path}: every system has runs; map its table")
            relations[name] = None
            continue
        if not isinstance(raw, Mapping) or not isinstance(raw.get("table"), str):
            problems.append(f"{path}: none, or a mapping with a table was expected")
            continue
        extra = sorted(set(raw) - {"table", "same_names", "columns", "deleted"})
        problems += [
            f"{path}.{x}: unknown key (table, same_names, columns, deleted)" for x in extra
        ]
        table = qualified(str(raw["table"]))
        deleted = None
        if raw.get("deleted") is not None:
            if name != "agent_runs":
                problems.append(f"{path}.deleted: only agent_runs may say what a DELETE means")
            elif raw.get("same_names"):
                problems.append(
                    f"{path}.deleted: a same_names relation is the contract's own table, "
                    "whose rows are never deleted; map its columns"
                )
            else:
                deleted = _deleted(raw["deleted"], f"{path}.deleted", problems)
                run_id = (raw.get("columns") or {}).get("run_id")
                if deleted is not None and not isinstance(run_id, str):
                    problems.append(
                        f"{path}.deleted: a deleted run is found again by its id, so "
                        "columns.run_id must name a column of the table"
                    )
        if raw.get("same_names"):
            if raw.get("columns"):
                problems.append(f"{path}: same_names and columns exclude each other")
            relations[name] = Relation(name, table, same_names=True)
            continue
        columns = raw.get("columns") or {}
        if not isinstance(columns, Mapping):
            problems.append(f"{path}.columns: a mapping of model column to value was expected")
            continue
        parsed: dict[str, Expr] = {}
        for column, value in columns.items():
            where = f"{path}.columns.{column}"
            if column not in COLUMNS[name]:
                problems.append(f"{where}: not a column of {name} ({', '.join(COLUMNS[name])})")
                continue
            parsed[str(column)] = _expr(value, where, problems)
        if name == "agent_runs":
            for needed in ("run_id", "status"):
                if parsed.get(needed) is None:
                    problems.append(f"{path}.columns.{needed}: every run has one; map it")
            status = parsed.get("status")
            if isinstance(status, Values):
                bad = sorted({v for _, v in status.values} - set(STATUSES))
                if bad:
                    problems.append(
                        f"{path}.columns.status.values: {bad} are not model statuses "
                        f"({', '.join(STATUSES)})"
                    )
        relations[name] = Relation(name, table, columns=parsed, deleted=deleted)
    if problems:
        raise ModelError(problems)
    return ModelMap(relations)


def _deleted(raw: Any, where: str, problems: list[str]) -> Deleted | None:
    """The ``deleted:`` section of agent_runs: ``{status: S, log: {table, key,
    column, latest?, values?}?}``, every status a terminal one."""
    terminal = ", ".join(TERMINAL)
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: a mapping with a status ({terminal}) was expected")
        return None
    extra = sorted(set(raw) - {"status", "log"})
    problems += [f"{where}.{x}: unknown key (status, log)" for x in extra]
    status = raw.get("status")
    ok = True
    if status not in TERMINAL:
        problems.append(
            f"{where}.status: the terminal status a deleted run ended with ({terminal}), "
            f"got {status!r}"
        )
        ok = False
    log = None
    if raw.get("log") is not None:
        log = _deleted_log(raw["log"], f"{where}.log", problems)
        ok = ok and log is not None
    return Deleted(str(status), log) if ok else None


def _deleted_log(raw: Any, where: str, problems: list[str]) -> DeletedLog | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: a mapping with table, key and column was expected")
        return None
    extra = sorted(set(raw) - {"table", "key", "column", "latest", "values"})
    problems += [f"{where}.{x}: unknown key (table, key, column, latest, values)" for x in extra]
    ok = True
    for needed in ("table", "key", "column"):
        if not isinstance(raw.get(needed), str) or not raw.get(needed):
            problems.append(f"{where}.{needed}: a name was expected")
            ok = False
    latest = raw.get("latest")
    if latest is not None and not isinstance(latest, str):
        problems.append(f"{where}.latest: the column whose greatest value is the newest row")
        ok = False
    values = raw.get("values") or {}
    if not isinstance(values, Mapping):
        problems.append(f"{where}.values: a mapping of the log's status to a model status")
        return None
    bad = sorted({str(v) for v in values.values()} - set(STATUSES))
    if bad:
        problems.append(f"{where}.values: {bad} are not model statuses ({', '.join(STATUSES)})")
        ok = False
    if not ok:
        return None
    return DeletedLog(
        qualified(raw["table"]),
        raw["key"],
        raw["column"],
        latest,
        tuple((str(k), str(v)) for k, v in values.items()),
    )


_KINDS = ("column", "last_of", "lookup", "plus_ms", "const")


def _expr(value: Any, where: str, problems: list[str]) -> Expr:
    if value is None or value == "none":
        return None
    if isinstance(value, str):
        return Column(value)
    if not isinstance(value, Mapping):
        problems.append(f"{where}: a column name, none, or one of {{{', '.join(_KINDS)}}}")
        return None
    # A lookup names the column it reads too: it is a lookup, not a column.
    kinds = ["lookup"] if "lookup" in value else [k for k in _KINDS if k in value]
    if len(kinds) != 1:
        problems.append(
            f"{where}: exactly one of {', '.join(_KINDS)} was expected, got {sorted(value)}"
        )
        return None
    kind = kinds[0]
    allowed = {
        "column": {"column", "values"},
        "last_of": {"last_of"},
        "lookup": {"lookup", "key", "via", "column"},
        "plus_ms": {"plus_ms", "of"},
        "const": {"const"},
    }[kind]
    extra = sorted(set(value) - allowed)
    if extra:
        problems.append(f"{where}: unknown key(s) {extra} for a {kind} value")
    if kind == "lookup":
        missing = [k for k in ("key", "via", "column") if not isinstance(value.get(k), str)]
        if missing or not isinstance(value.get("lookup"), str):
            problems.append(f"{where}: a lookup needs lookup (table), key, via and column")
            return None
        return Lookup(qualified(value["lookup"]), value["key"], value["via"], value["column"])
    if kind == "column":
        values = value.get("values") or {}
        if not isinstance(value["column"], str) or not isinstance(values, Mapping):
            problems.append(f"{where}: column must name a column, values map text to text")
            return None
        if values:
            return Values(value["column"], tuple((str(k), str(v)) for k, v in values.items()))
        return Column(value["column"])
    if kind == "last_of":
        if not isinstance(value["last_of"], str):
            problems.append(f"{where}.last_of: a column name was expected")
            return None
        return LastOf(value["last_of"])
    if kind == "plus_ms":
        ms = value["plus_ms"]
        if ms != "lease_ttl" and (not isinstance(ms, int) or isinstance(ms, bool) or ms < 0):
            problems.append(f"{where}.plus_ms: milliseconds (an integer) or lease_ttl")
            return None
        of = _expr(value.get("of"), f"{where}.of", problems)
        if of is None:
            problems.append(f"{where}.of: the time the duration is added to")
            return None
        return PlusMs(of, None if ms == "lease_ttl" else int(ms))
    const = value["const"]
    if not isinstance(const, str | int | float | bool):
        problems.append(f"{where}.const: text, a number or a boolean")
        return None
    return Const(const)

"""The contract's state space: for every ``ops`` operation, the states it may
start from and the relations between its arguments and what is stored, as
cells derived from ``operations.json`` (its ``state_space`` and each
operation's ``cells``), never listed by hand.

Invariants:
- :func:`derive` is a pure function of the contract document: an operation
  added to it adds its cells (one cell when it declares none), a value added
  to a dimension adds a cell to every group of every operation that varies
  that dimension;
- a group's cells are every combination of the group's dimensions, the
  operation's other dimensions at their base value, except those the group
  names ``any``: their value is :data:`ANY` (``*``), and an observation
  with any value of that dimension (or none read) belongs to the cell (a
  concern of the group's, never guessed: what the group varies is what it
  is about, the rest is incidental); the same combination reached by two
  groups is one cell;
- a cell matching an ``unreachable`` rule of its operation is declared with
  that rule's reason: listed, never counted as missing;
- the document is checked when loaded: every dimension a cell names is
  declared, every value is one of its dimension's values (a typo is an
  error naming the operation, never a cell nobody can reach).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from harness.contract.spec import OPERATIONS_FILE, ContractFileError

DIMENSION_KINDS = ("start", "relation")
#: The value of a dimension a group does not care about (its ``any``).
ANY = "*"


@dataclass(frozen=True)
class Dimension:
    """One axis of the state space: a stored state or an argument's relation to it."""

    name: str
    kind: str
    values: tuple[str, ...]
    meaning: str


@dataclass(frozen=True, order=True)
class Cell:
    """One operation started from one state with one relation of its arguments."""

    op: str
    values: tuple[tuple[str, str], ...]  # (dimension, value), in the op's base order

    @property
    def id(self) -> str:
        inner = ",".join(f"{d}={v}" for d, v in self.values)
        return f"{self.op}[{inner}]" if inner else self.op

    def get(self, dimension: str) -> str | None:
        return dict(self.values).get(dimension)

    def fits(self, observed: Mapping[str, str | None]) -> bool:
        """Whether an operation observed with these values belongs here: every
        dimension the cell fixes has that value; one it leaves ``*`` any."""
        return all(v == ANY or observed.get(d) == v for d, v in self.values)


@dataclass(frozen=True)
class Unreachable:
    """Cells of an operation that cannot be reached, and why."""

    when: Mapping[str, tuple[str, ...]]
    why: str

    def matches(self, cell: Cell) -> bool:
        values = dict(cell.values)
        return all(values.get(d) in allowed for d, allowed in self.when.items())


@dataclass(frozen=True)
class StateSpace:
    dimensions: Mapping[str, Dimension]
    cells: tuple[Cell, ...]
    #: cell id -> why it cannot be reached (declared in the contract)
    unreachable: Mapping[str, str]

    def of(self, op: str) -> list[Cell]:
        return [c for c in self.cells if c.op == op]

    def reachable(self) -> list[Cell]:
        return [c for c in self.cells if c.id not in self.unreachable]

    def by_id(self) -> dict[str, Cell]:
        return {c.id: c for c in self.cells}


def _dimensions(space: Mapping[str, Any]) -> dict[str, Dimension]:
    out: dict[str, Dimension] = {}
    for name, raw in dict(space.get("dimensions", {})).items():
        kind = str(raw.get("kind"))
        if kind not in DIMENSION_KINDS:
            raise ContractFileError(
                f"state_space dimension {name}: kind {kind!r} not in {DIMENSION_KINDS}"
            )
        values = tuple(str(v) for v in raw.get("values", ()))
        if not values or len(set(values)) != len(values):
            raise ContractFileError(
                f"state_space dimension {name}: values must be distinct and not empty"
            )
        out[name] = Dimension(name, kind, values, str(raw.get("meaning", "")))
    return out


def _check_value(op: str, dims: Mapping[str, Dimension], dim: str, value: object) -> str:
    if dim not in dims:
        raise ContractFileError(f"op {op}: cells name an undeclared dimension {dim!r}")
    if value not in dims[dim].values:
        raise ContractFileError(
            f"op {op}: {value!r} is not a value of dimension {dim} {dims[dim].values}"
        )
    return str(value)


def _op_cells(
    op: str, raw: Mapping[str, Any] | None, dims: Mapping[str, Dimension]
) -> tuple[list[Cell], list[Unreachable]]:
    if not raw:
        return [Cell(op, ())], []
    base = {d: _check_value(op, dims, d, v) for d, v in dict(raw.get("base", {})).items()}
    order = list(base)
    cells: dict[tuple[tuple[str, str], ...], Cell] = {}
    groups: Sequence[Mapping[str, Any]] = raw.get("groups") or [{"vary": order}]
    for group in groups:
        vary = [str(d) for d in group.get("vary", ())]
        fix = {d: _check_value(op, dims, d, v) for d, v in dict(group.get("fix", {})).items()}
        free = [str(d) for d in group.get("any", ())]
        for d in [*vary, *fix, *free]:
            if d not in base:
                raise ContractFileError(f"op {op}: group names {d!r}, which has no base value")
        if set(free) & {*vary, *fix}:
            raise ContractFileError(f"op {op}: a group's any names a dimension it varies or fixes")
        for combo in itertools.product(*(dims[d].values for d in vary)):
            values = {
                **base,
                **fix,
                **dict.fromkeys(free, ANY),
                **dict(zip(vary, combo, strict=True)),
            }
            key = tuple((d, values[d]) for d in order)
            cells.setdefault(key, Cell(op, key))
    rules = []
    for rule in raw.get("unreachable", ()):
        when = {
            d: tuple(v if v == ANY else _check_value(op, dims, d, v) for v in vs)
            for d, vs in dict(rule["when"]).items()
        }
        rules.append(Unreachable(when, str(rule["why"])))
    return list(cells.values()), rules


def derive(document: Mapping[str, Any]) -> StateSpace:
    """Every cell of every operation of a contract document (see the module's invariants)."""
    dims = _dimensions(document.get("state_space", {}))
    cells: list[Cell] = []
    unreachable: dict[str, str] = {}
    for raw in document["operations"]:
        op = str(raw["op"])
        found, rules = _op_cells(op, raw.get("cells"), dims)
        for cell in found:
            cells.append(cell)
            why = next((r.why for r in rules if r.matches(cell)), None)
            if why is not None:
                unreachable[cell.id] = why
    return StateSpace(dims, tuple(cells), unreachable)


@cache
def contract_space() -> StateSpace:
    """The state space of this repository's contract (operations.json)."""
    return derive(json.loads(OPERATIONS_FILE.read_text(encoding="utf-8")))


def describe(space: StateSpace) -> str:
    """One line per operation: how many cells, how many declared unreachable."""
    lines = []
    for op in dict.fromkeys(c.op for c in space.cells):
        cells = space.of(op)
        out = sum(c.id in space.unreachable for c in cells)
        lines.append(f"{op}: {len(cells)} cells" + (f" ({out} unreachable)" if out else ""))
    return "\n".join(lines)

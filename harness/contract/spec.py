"""The contract's operations and schemas as Python values.

Invariants:
- ``operations.json`` and ``schemas/ops.schema.json`` describe the same ops:
  every operation has an args and a result schema, and every schema'd op is
  an operation (checked when loaded, so the two files cannot drift apart);
- :func:`stale_holder_operations` is a pure function of the operation table:
  an operation added to ``operations.json`` that changes a run, its
  checkpoints, its ledger or its outbox and takes a lease epoch is covered
  by experiment R without any code change;
- :func:`fill` replaces only whole-string placeholders ``{name}``, so a value
  keeps its JSON type (an epoch stays an integer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from harness.contract import HERE, SCHEMAS

OPERATIONS_FILE = HERE / "operations.json"
OPS_SCHEMA_FILE = SCHEMAS / "ops.schema.json"
HISTORY_SCHEMA_FILE = SCHEMAS / "history-event.schema.json"
CONTROL_SCHEMA_FILE = SCHEMAS / "control-point.schema.json"

#: What an operation may change (operations.json ``changes``).
CHANGE_KINDS = frozenset({"run", "checkpoints", "ledger", "outbox", "tasks", "consumer", "audit"})
#: The changes a stale lease holder must never make (issue: stale-holder coverage).
FENCED_CHANGES = frozenset({"run", "checkpoints", "ledger", "outbox"})
IDENTITY_FIELDS = ("owner", "epoch", "expected_revision")
_PLACEHOLDER = re.compile(r"^\{([a-z_]+)\}$")


class ContractFileError(ValueError):
    """operations.json or a schema file contradicts itself or the other."""


@dataclass(frozen=True)
class Operation:
    """One ``ops`` operation of the contract (one entry of operations.json)."""

    op: str
    plane: str
    required: bool
    changes: frozenset[str]
    identity: tuple[str, ...]
    advances_revision: bool
    points: tuple[str, ...]
    checked_by: tuple[str, ...]
    summary: str
    example: Mapping[str, Any]

    @property
    def fenced(self) -> bool:
        """Acts under a lease (takes its epoch) and changes what the lease guards."""
        return "epoch" in self.identity and bool(self.changes & FENCED_CHANGES)


def _operation(raw: Mapping[str, Any]) -> Operation:
    op = Operation(
        op=str(raw["op"]),
        plane=str(raw["plane"]),
        required=bool(raw["required"]),
        changes=frozenset(raw["changes"]),
        identity=tuple(raw["identity"]),
        advances_revision=bool(raw["advances_revision"]),
        points=tuple(raw["points"]),
        checked_by=tuple(raw["checked_by"]),
        summary=str(raw["summary"]),
        example=dict(raw["example"]),
    )
    if op.plane not in ("worker", "control"):
        raise ContractFileError(f"op {op.op}: plane {op.plane!r} is not worker or control")
    if not op.changes <= CHANGE_KINDS:
        raise ContractFileError(f"op {op.op}: unknown changes {sorted(op.changes - CHANGE_KINDS)}")
    if not set(op.identity) <= set(IDENTITY_FIELDS):
        raise ContractFileError(f"op {op.op}: identity {op.identity} not of {IDENTITY_FIELDS}")
    if op.advances_revision and "expected_revision" not in op.identity:
        raise ContractFileError(f"op {op.op} advances the revision without expected_revision")
    return op


def parse_operations(data: Mapping[str, Any]) -> list[Operation]:
    """The operations of an operations.json document (validated, names unique)."""
    ops = [_operation(raw) for raw in data["operations"]]
    names = [o.op for o in ops]
    if len(set(names)) != len(names):
        raise ContractFileError(f"operations.json names an op twice: {names}")
    return ops


@cache
def operations() -> tuple[Operation, ...]:
    """The contract's operations, checked against the ops schema."""
    ops = parse_operations(json.loads(OPERATIONS_FILE.read_text(encoding="utf-8")))
    defs = ops_schema()["$defs"]
    schema_ops = {k.split(".")[0] for k in defs if k.endswith((".args", ".result"))}
    listed = {o.op for o in ops}
    for op in listed | schema_ops:
        if op not in listed or f"{op}.args" not in defs or f"{op}.result" not in defs:
            raise ContractFileError(
                f"op {op}: operations.json and ops.schema.json must both describe it "
                "(an entry, #/$defs/<op>.args and #/$defs/<op>.result)"
            )
    return tuple(ops)


def by_name() -> dict[str, Operation]:
    return {o.op: o for o in operations()}


def stale_holder_operations(ops: Sequence[Operation]) -> list[Operation]:
    """The operations a stale lease holder must be refused (experiment R's table)."""
    return [o for o in ops if o.fenced]


#: Values a wrong caller plausibly sends for a decision or an outcome besides
#: the contract's other enumerated values: the ledger's non-final statuses, a
#: word that names nothing, and (in invalid_choices) the verbs of the other
#: control-plane operations: an implementation that maps a decision straight
#: onto its own action table must not apply "resolve" or "cancel" as one.
_PLAUSIBLY_WRONG = ("prepared", "dispatching", "unknown", "cancelled", "bogus")


def enumerated_args(op: str) -> dict[str, tuple[str, ...]]:
    """The arguments of ``op`` whose values the contract enumerates (an ``enum``
    in ops.schema.json's ``<op>.args``), each with its values."""
    props = ops_schema()["$defs"].get(f"{op}.args", {}).get("properties", {})
    return {arg: tuple(p["enum"]) for arg, p in props.items() if "enum" in p}


def invalid_choices(ops: Sequence[Operation]) -> list[tuple[str, str, str]]:
    """(op, argument, value) for every control-plane decision of ``ops`` sent with
    a value outside its argument's enumeration: every other enumerated value of
    the contract and :data:`_PLAUSIBLY_WRONG`. Each must be refused and change
    nothing (experiment J[operator_resolves]); an enumeration added to the
    schema is probed without any code change."""
    controls = [o for o in ops if o.plane == "control" and "audit" in o.changes]
    verbs = {o.op.split("_")[0] for o in ops if o.plane == "control"}
    everything = sorted(
        {v for o in ops for values in enumerated_args(o.op).values() for v in values}
        | set(_PLAUSIBLY_WRONG)
        | verbs
    )
    return [
        (o.op, arg, value)
        for o in controls
        for arg, allowed in enumerated_args(o.op).items()
        for value in [*everything, *_near_misses(allowed)]
        if value not in allowed
    ]


def _near_misses(allowed: Sequence[str]) -> list[str]:
    """Each allowed value in another case or with a space around it: a value is
    the contract's word exactly or not at all (blind hunt 65 #08: a Go helper
    that lower-cased and trimmed decisions "typed by hand" took "Approve")."""
    return [
        variant
        for value in allowed
        for variant in (value.upper(), value.capitalize(), f" {value}", f"{value} ")
    ]


def fill(template: Any, values: Mapping[str, Any]) -> Any:
    """``template`` with every whole-string ``{name}`` replaced by ``values[name]``."""
    if isinstance(template, str):
        match = _PLACEHOLDER.match(template)
        if match is None:
            return template
        if match.group(1) not in values:
            raise KeyError(f"no value for placeholder {template}")
        return values[match.group(1)]
    if isinstance(template, Mapping):
        return {k: fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, values) for v in template]
    return template


@cache
def _load(path: Path) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def ops_schema() -> dict[str, Any]:
    return _load(OPS_SCHEMA_FILE)


def _problems(schema: Mapping[str, Any], instance: Any, validator: Any | None = None) -> list[str]:
    validator = validator or jsonschema.Draft202012Validator(schema)
    return [
        f"{'/'.join(str(p) for p in err.absolute_path) or '(top)'}: {err.message}"
        for err in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    ]


def _ref(name: str) -> dict[str, Any]:
    root = ops_schema()
    return {"$defs": root["$defs"], "$ref": f"#/$defs/{name}"}


@cache
def _ref_validator(name: str) -> jsonschema.Draft202012Validator | None:
    # Built once per definition: every reply of every experiment is checked.
    if name not in ops_schema()["$defs"]:
        return None
    return jsonschema.Draft202012Validator(_ref(name))


def reply_problems(op: str, reply: Mapping[str, Any]) -> list[str]:
    """Why one ``ops`` reply line breaks the schema (envelope, then the op's result)."""
    problems = _problems({}, reply, _ref_validator("reply"))
    if problems or reply.get("ok") is not True:
        return problems
    result = _ref_validator(f"{op}.result")
    if result is None:
        return [f"result: {op!r} is no operation of the contract"]
    return [f"result/{p}" for p in _problems({}, reply.get("result"), result)]


def history_problems(line: Mapping[str, Any]) -> list[str]:
    return _problems(_load(HISTORY_SCHEMA_FILE), line)

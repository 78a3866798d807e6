"""A system's declared mapping: what it offers, read from the system itself.

A system under test keeps one file in its own repository (versioned with its
code) and prints it when run as ``<worker-cmd> mapping`` (docs/worker-contract.md
section 14). It states the system's capabilities (fencing token, revision
check, renewal model, ledger and the tool capabilities it handles, outbox,
consumer dedupe, tenants, operator actions, the built-in workflow, the
injection points it hosts) and how its tables read as the harness's model.

Invariants:
- a mapping is validated whole before anything reads it: each problem names
  its field by path (``capabilities.renewal``) and what was expected there;
  an invalid mapping is never half used;
- a worker command that offers no ``mapping`` mode (it exits non-zero or
  prints nothing) declares the contract's own mapping (``mapping.yaml`` next
  to this module: the tables of sections 6 and 7, every capability, every
  point), so every worker goes through one code path;
- :func:`declared` asks a command once per process; what it printed is kept
  (``source``) for the archive and the contract report.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import jsonschema
import yaml

from harness.contract import HERE, SCHEMAS, points
from harness.model.spec import ModelError, ModelMap
from harness.model.spec import parse as parse_model

DEFAULT_FILE = HERE / "mapping.yaml"
SCHEMA_FILE = SCHEMAS / "mapping.schema.json"
#: How long ``<worker-cmd> mapping`` may take (it needs no environment); past
#: it the command is taken to offer no such mode.
MODE_TIMEOUT_ENV = "FENCECHECK_MAPPING_TIMEOUT_S"
MODE_TIMEOUT_S = 30.0
#: At most this much of what the command prints is read.
MAX_BYTES = 1 << 20

Renewal = Literal["per_lease", "per_process", "none"]
Tenants = Literal["rls", "column", "none"]
TOOL_LEVELS = ("idempotent", "deterministic_id", "query", "none")

#: The optional capabilities experiments may need (ExperimentSpec.needs), each
#: with what it means. The fencing token is not one of them: the protocol
#: needs it for safety, so its absence never makes an experiment not
#: applicable (B, K and R run and fail if a stale write or release lands).
CAPABILITIES: dict[str, str] = {
    "checkpoints": "progress writes that keep the run's state (save_checkpoint)",
    "revision_check": "progress writes that compare and advance a revision",
    "ledger": "a side-effect ledger (intent, dispatch claim, result)",
    **{f"ledger_tool:{t}": f"a ledger that handles tools of capability {t}" for t in TOOL_LEVELS},
    "outbox": "an outbox written with each protected write, and its relay",
    "consumer_dedupe": "a consumer that deduplicates by event_id",
    "tenants:rls": "tenant isolation by row level security on every tenant table",
    "operator_actions": "the optional operator ops resolve_indoubt and decide, audited",
    "workflow": "`run` mode runs the built-in workflow of contract section 10",
    "retention": "the optional operator op purge: old finished tasks archived, then deleted",
    "renewal": "leases renewed at all (per lease or per process)",
    "contract_schema": "the tables of contract section 6 under their own names (N probes them "
    "with raw statements, M plants a checkpoint row)",
    "renewal:per_lease": "each lease renewed by its holder on request (the heartbeat op)",
    "clock_skew": "a wall clock the harness can set back (libfaketime preloaded: a program "
    "that reads the clock through the C library; Go binaries do not)",
}

#: The capability each op of operations.json belongs to where it has one: a
#: system that declares it lacks that capability does not offer the op (the
#: harness does not send it, and says so), and an experiment judging every
#: op (R) leaves it out rather than ending unknown.
OP_CAPABILITY: dict[str, str] = {
    "renew": "renewal",
    "heartbeat": "renewal:per_lease",
    "save_checkpoint": "checkpoints",
    "read_checkpoint": "checkpoints",
    "legacy_checkpoint": "checkpoints",
    "register_intent": "ledger",
    "dispatch": "ledger",
    "reconcile": "ledger",
    "deliver_callback": "ledger",
    "relay": "outbox",
    "consume": "consumer_dedupe",
    "resolve_indoubt": "operator_actions",
    "decide": "operator_actions",
    "converge_operation": "operator_actions",
    "purge": "retention",
}


class MappingError(ValueError):
    """A mapping that cannot be used: every problem, each naming its field."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        shown = "; ".join(self.problems[:8])
        more = f" (and {len(self.problems) - 8} more)" if len(self.problems) > 8 else ""
        super().__init__(f"mapping from {source} is not valid: {shown}{more}")


@dataclass(frozen=True)
class Backoff:
    """The requeue delays a system declares (section 14, ``capabilities.backoff``)."""

    base_ms: int
    cap_ms: int
    jitter: Literal["equal", "full", "none"]

    def bounds_ms(self, attempt: int) -> tuple[float, float]:
        """The shortest and longest delay a requeue after ``attempt`` (from 1) may schedule."""
        full = float(min(self.base_ms * 2 ** min(max(attempt, 1) - 1, 32), self.cap_ms))
        low = {"equal": full / 2, "full": 0.0, "none": full}[self.jitter]
        return low, full


@dataclass(frozen=True)
class Capabilities:
    """What the system declares it offers (section 14, ``capabilities``)."""

    fencing_token: bool
    revision_check: bool
    checkpoints: bool
    renewal: Renewal
    ledger: bool
    ledger_tools: frozenset[str]
    outbox: bool
    consumer_dedupe: bool
    tenants: Tenants
    operator_actions: bool
    workflow: bool
    injection_points: frozenset[str]
    #: Derived from the mapping's model: every relation same-named (section 6).
    contract_schema: bool = True
    #: Optional in the mapping (default false): a system that deletes nothing.
    retention: bool = False
    #: Optional in the mapping: the requeue delays it schedules (None: not declared).
    backoff: Backoff | None = None
    #: Optional in the mapping (default true): the harness can set the worker's
    #: wall clock back (harness/parts/clock_skew.py).
    clock_skew: bool = True

    def offers(self, name: str) -> bool:
        """Whether the system offers capability ``name`` of :data:`CAPABILITIES`."""
        if name.startswith("ledger_tool:"):
            return self.ledger and name.split(":", 1)[1] in self.ledger_tools
        if name == "tenants:rls":
            return self.tenants == "rls"
        if name == "renewal":
            return self.renewal != "none"
        if name == "renewal:per_lease":
            return self.renewal == "per_lease"
        value = getattr(self, name)
        return bool(value)

    def offers_op(self, op: str) -> bool:
        """Whether the system offers ``op`` by what it declares (:data:`OP_CAPABILITY`)."""
        needed = OP_CAPABILITY.get(op)
        return needed is None or self.offers(needed)

    def hosts(self, point: str) -> bool:
        return point in self.injection_points

    def lacks(self) -> list[str]:
        """The capabilities of :data:`CAPABILITIES` it does not offer, in order."""
        return [name for name in CAPABILITIES if not self.offers(name)]


@dataclass(frozen=True)
class Declaration:
    """One system's validated mapping file."""

    system: str
    version: str
    layer: Literal["queue", "workflow"]
    capabilities: Capabilities
    #: How its tables read as the observation model (harness.model).
    model: ModelMap
    #: Where it came from: ``<command> mapping`` or the contract's default file.
    source: str
    text: str

    @property
    def own(self) -> bool:
        """Declared by the system itself (not the contract's default)."""
        return self.source != str(DEFAULT_FILE)


@cache
def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def _path(parts: Sequence[Any]) -> str:
    return ".".join(str(p) for p in parts) or "(top)"


def parse(text: str, source: str) -> Declaration:
    """The declaration in ``text`` (YAML), or MappingError naming every problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise MappingError(source, [f"(top): not YAML{where}"]) from exc
    validator = jsonschema.Draft202012Validator(_schema())
    problems = [
        f"{_path(e.absolute_path)}: {e.message}"
        for e in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    ]
    if problems:
        raise MappingError(source, problems)
    caps = data["capabilities"]
    unknown = sorted(set(caps["injection_points"]) - points.ALL)
    if unknown:
        problems.append(
            f"capabilities.injection_points: {unknown} are not points of contract section 3"
        )
    if caps["revision_check"] and not caps["checkpoints"]:
        problems.append("capabilities.revision_check: true needs checkpoints: true")
    if caps["consumer_dedupe"] and not caps["outbox"]:
        problems.append("capabilities.consumer_dedupe: true needs outbox: true")
    try:
        model = parse_model(data.get("model"))
    except ModelError as exc:
        problems += exc.problems
    if problems:
        raise MappingError(source, problems)
    ledger = caps["ledger"]
    capabilities = Capabilities(
        fencing_token=caps["fencing_token"],
        revision_check=caps["revision_check"],
        checkpoints=caps["checkpoints"],
        renewal=caps["renewal"],
        ledger=ledger is not False,
        ledger_tools=frozenset(ledger["tools"]) if ledger is not False else frozenset(),
        outbox=caps["outbox"],
        consumer_dedupe=caps["consumer_dedupe"],
        tenants=caps["tenants"],
        operator_actions=caps["operator_actions"],
        workflow=caps["workflow"],
        injection_points=frozenset(caps["injection_points"]),
        contract_schema=model.identity,
        retention=caps.get("retention", False),
        backoff=Backoff(**caps["backoff"]) if "backoff" in caps else None,
        clock_skew=caps.get("clock_skew", True),
    )
    return Declaration(
        system=data["system"]["name"],
        version=str(data["system"].get("version", "")),
        layer=data.get("layer", "workflow"),
        capabilities=capabilities,
        model=model,
        source=source,
        text=text,
    )


def default() -> Declaration:
    """The contract's own mapping: the tables of sections 6 and 7, everything offered."""
    return parse(DEFAULT_FILE.read_text(encoding="utf-8"), str(DEFAULT_FILE))


def _mode_timeout_s() -> float:
    """MODE_TIMEOUT_S, or what $FENCECHECK_MAPPING_TIMEOUT_S says (a bad value:
    the default, as FENCECHECK_MIGRATE_TIMEOUT_S does)."""
    try:
        return float(os.environ.get(MODE_TIMEOUT_ENV) or MODE_TIMEOUT_S)
    except ValueError:
        return MODE_TIMEOUT_S


@cache
def declared(worker_cmd: tuple[str, ...]) -> Declaration:
    """What ``<worker-cmd> mapping`` prints, validated; the contract's default when
    the command offers no such mode. MappingError when it prints one that is
    not valid (a system's wrong declaration is never replaced by the default)."""
    source = " ".join([*worker_cmd, "mapping"])
    try:
        proc = subprocess.run(
            [*worker_cmd, "mapping"],
            capture_output=True,
            timeout=_mode_timeout_s(),
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return default()
    text = proc.stdout[:MAX_BYTES].decode("utf-8", "replace")
    if proc.returncode != 0 or not text.strip():
        return default()
    return parse(text, source)


def of_file(path: Path) -> Declaration:
    """A mapping file read directly (tests, `fencecheck contract` of a file)."""
    return parse(path.read_text(encoding="utf-8"), str(path))

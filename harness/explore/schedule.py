"""A fault schedule as data: the workload and the nemesis of one exploration run.

A schedule is what Hypothesis draws (harness/explore/generate.py), what the
campaign runs, what shrinking makes smaller and what ``fencecheck replay``
reads back. It round-trips through YAML a person can write by hand
(docs/explore.md shows the format); :func:`from_dict` names the field that
is wrong, never a traceback.

Times (``at_ms``) count from the moment every worker has been started.
Workers and runs are named by their index in the schedule's lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from harness.evidence import bounded_read
from harness.evidence.bounded_read import token

FORMAT_VERSION = 1
TOOLS = ("idem", "detid", "queryable", "plain")  # one tool per capability level
WRITE_PATHS = ("fast", "stepped")
CONTROL_ACTIONS = ("cancel", "retry", "late_callback")
# Points a `run`-mode worker (or the relay) passes; the two inside a
# protected write's transaction only on the stepped write path.
POINTS = (
    "after_lease_acquired",
    "after_checkpoint_commit",
    "after_outbound_intent_commit",
    "after_dispatch_claim_commit",
    "after_tool_response_before_tx2_commit",
    "before_renew",
    "after_lease_row_locked",
    "before_commit",
    "after_broker_ack_before_outbox_mark",
)
STEPPED_ONLY_POINTS = ("after_lease_row_locked", "before_commit")
# A worker's own link to PostgreSQL; the shared link to the tool; the
# standby's link to the primary (only with replication).
LINKS = ("pg", "tool", "replication")
REPLICATION = ("none", "async", "sync")
LINK_FAULTS = ("cut", "blackhole", "reset", "latency", "drop_responses")
TOOL_MODES = (
    "drop_after_act",
    "error_5xx_after_act",
    "reject_429",
    "hang",
    "delay",
    "conflict_other_body",
    "accept_without_result",
    "answer_late",
    "reject_final",
)
# Tool modes that take their duration (duration_ms) as the mock tool's ``ms``.
TOOL_MODES_WITH_MS = ("hang", "delay", "answer_late")
FAULT_KINDS = ("pause", "kill", "crash_at", "hold", "link", "tool", "stale", "failover")
STALE_OPS = ("save_checkpoint", "renew", "release")
ANY = "any"  # a point fault for whichever worker reaches the point first
RELAY = "relay"  # the outbox relay process, as a target of a point fault


class ScheduleError(ValueError):
    """A schedule file or mapping that does not describe a schedule."""


@dataclass(frozen=True)
class Run:
    """One run of the workload: the built-in workflow's input (worker contract §10)."""

    tool: str = "idem"
    tenant: int = 0
    extra_steps: int = 0
    step_delay_ms: int = 0
    #: The run's attempt budget (create_run's max_attempts); None: the worker's default.
    max_attempts: int | None = None


@dataclass(frozen=True)
class ControlAction:
    """Something the control plane does at a moment: cancel the run, retry its
    task, or deliver a late callback for the run's first tool request."""

    action: str
    run: int
    at_ms: int


@dataclass(frozen=True)
class Fault:
    """One nemesis step. Which fields matter depends on ``kind``:

    * ``pause``: SIGSTOP ``worker`` at ``at_ms`` for ``duration_ms``, then SIGCONT;
      with a ``point``: SIGSTOP it when it reaches the point (held there until
      the kernel confirms it stopped, then its barrier answered), so it
      resumes right where a stale holder does harm.
    * ``kill``: SIGKILL ``worker`` at ``at_ms``.
    * ``crash_at``: ``worker`` (or ``any``, or ``relay``) kills itself when it
      reaches ``point`` (the control protocol's crash answer).
    * ``hold``: ``worker`` is held at ``point`` for ``duration_ms`` while the
      others proceed, then released (``then: release``) or crashed.
    * ``link``: ``fault`` (cut/blackhole/reset/latency of ``latency_ms``) on
      ``link`` (``pg`` of ``worker``, or the shared ``tool`` link) from
      ``at_ms`` for ``duration_ms``.
    * ``tool``: the mock tool answers ``count`` creates of ``tool`` with
      ``mode`` (``delay``/``hang`` for ``duration_ms``) once ``skip`` of them
      passed, armed at ``at_ms`` (at 0: before the workers start).
    * ``stale``: at ``at_ms`` a stale holder of run ``run`` (a session of the
      worker role that kept an old lease: an earlier owner and epoch after a
      takeover, or the current ones once the lease expired by database time)
      sends ``op`` (save_checkpoint / renew / release) with that identity,
      as a worker whose own lease guard failed would; with ``point:
      after_lease_acquired`` at once when another worker takes the run over.
    * ``failover``: at ``at_ms`` the primary is fenced (stopped) and the
      streaming standby promoted; every worker link then dials the new
      primary (needs the schedule's ``replication``).
    """

    kind: str
    at_ms: int = 0
    worker: int | str = 0
    duration_ms: int = 0
    point: str | None = None
    then: str = "release"
    link: str | None = None
    fault: str | None = None
    latency_ms: int = 0
    mode: str | None = None
    tool: str = "*"
    count: int = 1
    run: int | str = 0  # a run index, or "any" (stale faults)
    op: str = "save_checkpoint"
    skip: int = 0  # tool faults: matching creates that pass first

    def label(self) -> str:
        """A short name for progress lines and the coverage table."""
        if self.kind == "stale":
            return f"stale {self.op} run {self.run}" + (" on takeover" if self.point else "")
        if self.point is not None:
            return f"{self.kind} w{self.worker}@{self.point}"
        if self.kind == "link":
            return f"{self.fault} {self.link}" + (f" w{self.worker}" if self.link == "pg" else "")
        if self.kind == "failover":
            return "failover"
        if self.kind == "tool":
            return f"tool {self.mode}" + (f" after {self.skip}" if self.skip else "")
        return f"{self.kind} w{self.worker}"


@dataclass(frozen=True)
class Schedule:
    """One exploration run: workers, runs, control actions and faults."""

    workers: int = 3
    tenants: int = 1
    runs: tuple[Run, ...] = (Run(),)
    actions: tuple[ControlAction, ...] = ()
    faults: tuple[Fault, ...] = ()
    write_path: str = "fast"
    lease_ttl_ms: int = 800
    relay: bool = True
    #: none, or a primary of the schedule's own with a standby streaming
    #: asynchronously or synchronously (failover and link faults on it).
    replication: str = "none"
    #: Cells of the contract's state space the contract machine aims at, in
    #: order (harness/explore/machine.py); each a cell id of state_space.py.
    aims: tuple[str, ...] = ()
    seed: int | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def size(self) -> int:
        """How big the schedule is, for shrinking and reports: every worker, run,
        action and fault counts one."""
        return self.workers + len(self.runs) + len(self.actions) + len(self.faults) + len(self.aims)

    def worker_tenant(self, worker: int) -> int:
        """Workers are spread over the tenants round-robin."""
        return worker % self.tenants

    def horizon_ms(self) -> int:
        """When the last drawn step (and its end) is due."""
        ends = [a.at_ms for a in self.actions]
        ends += [f.at_ms + f.duration_ms for f in self.faults]
        return max(ends, default=0)


# ---------------------------------------------------------------- to / from data


def to_dict(schedule: Schedule) -> dict[str, Any]:
    """The schedule as plain data, with default-valued fault fields left out."""
    defaults = Fault(kind="pause")
    faults = []
    for f in schedule.faults:
        item = {"kind": f.kind}
        for name, value in dataclasses.asdict(f).items():
            if name != "kind" and value != getattr(defaults, name):
                item[name] = value
        faults.append(item)
    return {
        "version": FORMAT_VERSION,
        "workers": schedule.workers,
        "tenants": schedule.tenants,
        "write_path": schedule.write_path,
        "lease_ttl_ms": schedule.lease_ttl_ms,
        "relay": schedule.relay,
        **({"replication": schedule.replication} if schedule.replication != "none" else {}),
        "seed": schedule.seed,
        "note": schedule.note,
        "runs": [dataclasses.asdict(r) for r in schedule.runs],
        "actions": [dataclasses.asdict(a) for a in schedule.actions],
        "faults": faults,
        **({"aims": list(schedule.aims)} if schedule.aims else {}),
    }


def dump(schedule: Schedule) -> str:
    return yaml.safe_dump(to_dict(schedule), sort_keys=False, width=100)


def write(path: Path, schedule: Schedule) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dump(schedule))
    tmp.replace(path)
    return path


def load(path: Path) -> Schedule:
    """Read and validate a schedule file; ScheduleError says what to fix (and
    quotes no more of the file than the offending value, cut short).
    bounded_read.FileRefused when it is not a regular file, too large or too deep."""
    try:
        data = bounded_read.load_yaml(path)
    except OSError as exc:
        raise ScheduleError(f"cannot read schedule {path}: {exc.strerror or exc}") from None
    except bounded_read.NotParsed as exc:
        raise ScheduleError(str(exc)) from None
    try:
        return from_dict(data)
    except ScheduleError as exc:
        raise ScheduleError(f"{path}: {exc}") from exc


def _int(data: Mapping[str, Any], key: str, where: str, lo: int, hi: int, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ScheduleError(
            f"{where}.{key} must be a whole number from {lo} to {hi}, not {token(value)}"
        )
    return value


def _choice(
    data: Mapping[str, Any], key: str, where: str, options: tuple[str, ...], default: str | None
) -> str:
    value = data.get(key, default)
    if value not in options:
        raise ScheduleError(
            f"{where}.{key} must be one of {', '.join(options)}, not {token(value)}"
        )
    return cast(str, value)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ScheduleError(f"{where} must be a mapping, not {type(value).__name__}")
    return value


def _known(data: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    unknown = set(data) - allowed
    if unknown:
        raise ScheduleError(
            f"{where}: unknown field(s) {bounded_read.field_names(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


def from_dict(data: Any) -> Schedule:
    """Validate plain data (from YAML) into a Schedule; errors name the field."""
    top = _mapping(data, "the schedule")
    _known(
        top,
        "schedule",
        {
            "version",
            "workers",
            "tenants",
            "write_path",
            "lease_ttl_ms",
            "relay",
            "seed",
            "note",
            "runs",
            "actions",
            "faults",
            "aims",
            "replication",
        },
    )
    if top.get("version", FORMAT_VERSION) != FORMAT_VERSION:
        raise ScheduleError(
            f"schedule.version must be {FORMAT_VERSION}, not {token(top.get('version'))}"
        )
    workers = _int(top, "workers", "schedule", 1, 8, 3)
    tenants = _int(top, "tenants", "schedule", 1, 2, 1)
    if tenants > workers:
        raise ScheduleError(
            f"schedule.tenants ({tenants}) needs at least as many workers ({workers})"
        )
    seed = top.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ScheduleError(f"schedule.seed must be a whole number or absent, not {token(seed)}")
    relay = top.get("relay", True)
    if not isinstance(relay, bool):
        raise ScheduleError(f"schedule.relay must be true or false, not {token(relay)}")
    raw_runs = top.get("runs") or []
    if not isinstance(raw_runs, list) or not raw_runs:
        raise ScheduleError("schedule.runs must be a non-empty list of runs")
    runs = []
    for i, item in enumerate(raw_runs):
        where = f"runs[{i}]"
        r = _mapping(item, where)
        _known(r, where, {f.name for f in dataclasses.fields(Run)})
        runs.append(
            Run(
                tool=_choice(r, "tool", where, TOOLS, "idem"),
                tenant=_int(r, "tenant", where, 0, tenants - 1, 0),
                extra_steps=_int(r, "extra_steps", where, 0, 10, 0),
                step_delay_ms=_int(r, "step_delay_ms", where, 0, 5000, 0),
                max_attempts=None
                if r.get("max_attempts") is None
                else _int(r, "max_attempts", where, 1, 100, 12),
            )
        )
    actions = []
    for i, item in enumerate(top.get("actions") or []):
        where = f"actions[{i}]"
        a = _mapping(item, where)
        _known(a, where, {f.name for f in dataclasses.fields(ControlAction)})
        actions.append(
            ControlAction(
                action=_choice(a, "action", where, CONTROL_ACTIONS, None),
                run=_int(a, "run", where, 0, len(runs) - 1, 0),
                at_ms=_int(a, "at_ms", where, 0, 60_000, 0),
            )
        )
    write_path = _choice(top, "write_path", "schedule", WRITE_PATHS, "fast")
    replication = _choice(top, "replication", "schedule", REPLICATION, "none")
    faults = [
        _fault(_mapping(item, f"faults[{i}]"), f"faults[{i}]", workers, write_path, len(runs))
        for i, item in enumerate(top.get("faults") or [])
    ]
    for i, f in enumerate(faults):
        if replication == "none" and (f.kind == "failover" or f.link == "replication"):
            raise ScheduleError(
                f"faults[{i}] ({f.label()}) needs a standby: set replication: async or sync"
            )
    return Schedule(
        workers=workers,
        tenants=tenants,
        runs=tuple(runs),
        actions=tuple(actions),
        faults=tuple(faults),
        aims=_aims(top.get("aims")),
        replication=replication,
        write_path=write_path,
        lease_ttl_ms=_int(top, "lease_ttl_ms", "schedule", 200, 10_000, 800),
        relay=relay,
        seed=seed,
        note=str(top.get("note") or ""),
    )


def _aims(raw: Any) -> tuple[str, ...]:
    from harness.contract.state_space import contract_space

    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ScheduleError("schedule.aims must be a list of cell ids")
    cells = contract_space().by_id()
    for i, aim in enumerate(raw):
        if aim not in cells:
            raise ScheduleError(
                f"aims[{i}] must be a cell of the contract's state space "
                f"(harness/contract/state_space.py derives them), not {token(aim)}"
            )
    return tuple(str(a) for a in raw)


def _worker(
    f: Mapping[str, Any], where: str, workers: int, *, special: tuple[str, ...] = ()
) -> int | str:
    value = f.get("worker", 0)
    if isinstance(value, str) and value in special:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < workers:
        extra = f" or {', '.join(special)}" if special else ""
        raise ScheduleError(
            f"{where}.worker must be a worker index from 0 to {workers - 1}{extra}, not {token(value)}"
        )
    return value


def _fault(f: Mapping[str, Any], where: str, workers: int, write_path: str, runs: int) -> Fault:
    _known(f, where, {x.name for x in dataclasses.fields(Fault)})
    kind = _choice(f, "kind", where, FAULT_KINDS, None)
    at_ms = _int(f, "at_ms", where, 0, 60_000, 0)
    duration = _int(f, "duration_ms", where, 0, 60_000, 0)
    if kind == "stale":
        point = f.get("point")
        if point not in (None, "after_lease_acquired"):
            raise ScheduleError(f"{where}.point of a stale fault is after_lease_acquired or absent")
        return Fault(
            kind=kind,
            at_ms=at_ms,
            point=point,
            run=ANY if f.get("run") == ANY else _int(f, "run", where, 0, runs - 1, 0),
            op=_choice(f, "op", where, STALE_OPS, "save_checkpoint"),
        )
    if kind == "failover":
        return Fault(kind=kind, at_ms=at_ms)
    if kind == "kill" or (kind == "pause" and f.get("point") is None):
        return Fault(
            kind=kind, at_ms=at_ms, worker=_worker(f, where, workers), duration_ms=duration
        )
    if kind in ("crash_at", "hold", "pause"):
        point = _choice(f, "point", where, POINTS, None)
        if point in STEPPED_ONLY_POINTS and write_path != "stepped":
            raise ScheduleError(
                f"{where}.point {point} exists only on the stepped write path: set write_path: stepped"
            )
        special = (ANY, RELAY) if kind == "crash_at" else (ANY,)
        then = _choice(f, "then", where, ("release", "crash"), "release")
        return Fault(
            kind=kind,
            worker=_worker(f, where, workers, special=special),
            point=point,
            duration_ms=duration,
            then=then,
        )
    if kind == "link":
        link = _choice(f, "link", where, LINKS, None)
        fault = _choice(f, "fault", where, LINK_FAULTS, None)
        worker = _worker(f, where, workers) if link == "pg" else 0
        latency = _int(f, "latency_ms", where, 0, 10_000, 0)
        return Fault(
            kind=kind,
            at_ms=at_ms,
            worker=worker,
            duration_ms=duration,
            link=link,
            fault=fault,
            latency_ms=latency,
        )
    mode = _choice(f, "mode", where, TOOL_MODES, None)
    tool = _choice(f, "tool", where, ("*", *TOOLS), "*")
    return Fault(
        kind=kind,
        at_ms=at_ms,
        mode=mode,
        tool=tool,
        count=_int(f, "count", where, 1, 10, 1),
        skip=_int(f, "skip", where, 0, 100, 0),
        duration_ms=duration,
    )

"""One archive's facts placed in time, each with its source: what a timeline draws.

Lanes: the harness (signals, link faults, barrier hits and answers, its other
actions), one per worker (the worker's own account of its operations, with
the spans where the harness stopped or killed it or cut its link), the
database (epoch bars and accepted writes from the harness's audit trail,
never from worker accounts; for H the failover), and the mock tool (requests,
created resources and broker messages from its own log).

Invariants:
- Every fact carries its source; only "worker" facts come from a worker's
  account, and nothing from a worker ever draws an epoch bar or a write the
  database accepted.
- Missing or malformed optional fields give fewer facts, never an error: an
  archive of an experiment whose environment never came up still has a
  picture (with empty lanes).
- Times are seconds since the epoch; the picture starts at the first fact
  and ends at the last (leases running past the last fact are cut there).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.checking.history import Event, Operation, operations

Source = Literal["harness", "database", "tool", "worker"]

SOURCE_TEXT: dict[str, str] = {
    "harness": "observed by the harness itself",
    "database": "recorded by PostgreSQL (the harness's audit trigger)",
    "tool": "from the mock tool's own log",
    "worker": "the worker's own account (explains, never decides)",
}

HARNESS = "harness"
DATABASE = "database"
TOOL = "tool"
# The fault spans an experiment injects; every one in the archive is drawn.
FAULT_KINDS = ("stopped", "killed", "link")
# Operations that change protected state: drawn with their revision.
WRITE_OPS = frozenset({"save_checkpoint", "register_intent", "complete", "tool_result", "start"})
LINK_NAME = re.compile(r"^.*?_[0-9a-f]{6}_(?P<key>.+)$")
REPLY_COMMAND = re.compile(r"^[\w.-]+: \w+ [\[{]")
SIGNAL_COMMAND = re.compile(r"^SIG(STOP|CONT|KILL) ")
COVERED_COMMANDS = ("toxiproxy:", "arm ", "release ")


def worker_lane(worker: str) -> str:
    return f"worker:{worker}"


@dataclass(frozen=True)
class Lane:
    key: str
    title: str
    rows: tuple[str, ...]
    worker: str | None = None


@dataclass(frozen=True)
class Span:
    """Something that lasted: an epoch held, a stop, a link fault, a held barrier.

    ``end`` None means it lasted past the end of the picture. ``fault`` marks
    the fault spans the experiment injected (one per fault in the archive).
    """

    lane: str
    row: str
    start: float
    end: float | None
    kind: str
    label: str
    detail: str
    source: Source
    owner: str | None = None
    fault: str | None = None


@dataclass(frozen=True)
class Mark:
    """Something that happened at one moment (``since``: when it began, for an
    operation or a request that took time)."""

    lane: str
    row: str
    at: float
    kind: str
    label: str
    detail: str
    source: Source
    outcome: str | None = None
    since: float | None = None
    owner: str | None = None


@dataclass(frozen=True)
class Moment:
    at: float
    text: str
    source: Source


@dataclass
class Picture:
    start: float
    end: float
    lanes: list[Lane]
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    moments: list[Moment] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)

    def rel(self, at: float) -> str:
        """``at`` as '+1.234 s' from the start of the picture."""
        return f"+{at - self.start:.3f} s"


# --------------------------------------------------------------- reading
def timestamp(value: Any) -> float | None:
    """Seconds since the epoch from a float or an ISO text; None if neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dt.datetime):  # a YAML timestamp the loader already parsed
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()
    if isinstance(value, str) and value:
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        return parsed.timestamp()
    return None


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one (optional fields may be absent)."""
    return value if isinstance(value, Mapping) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def short(value: Any, n: int = 8) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= n else text[:n]


def owner_worker(owner: Any) -> str | None:
    """The worker id in an owner 'A/2d5f16d6f257' (worker/session)."""
    if not owner:
        return None
    return str(owner).split("/", 1)[0]


def _events(archive: Mapping[str, Any]) -> list[Event]:
    events = []
    for raw in _dicts(archive.get("history")):
        try:
            events.append(Event.from_json(raw, str(raw.get("source", "")), int(raw.get("line", 0))))
        except (KeyError, ValueError, TypeError):
            continue  # an unreadable history line is listed as raw evidence, not drawn
    return events


@dataclass(frozen=True)
class AuditChange:
    """One audited row change, flattened (the trigger's flat columns, or a
    table/new/old shape)."""

    seq: int
    at: float
    app: str
    op: str
    table: str
    run_id: str | None
    txid: Any
    new: Mapping[str, Any]
    old: Mapping[str, Any]


def audit_changes(archive: Mapping[str, Any]) -> list[AuditChange]:
    changes = []
    for index, row in enumerate(_dicts(archive.get("audit_trail"))):
        at = timestamp(row.get("at"))
        if at is None:
            continue
        new = row.get("new") if isinstance(row.get("new"), dict) else None
        old = row.get("old") if isinstance(row.get("old"), dict) else None
        if new is None and old is None:
            new = {k: v for k, v in row.items() if not k.startswith("old_")}
            old = {k[4:]: v for k, v in row.items() if k.startswith("old_")}
        new = new or {}
        old = old or {}
        run_id = new.get("run_id", old.get("run_id", row.get("run_id")))
        seq = row.get("seq")
        changes.append(
            AuditChange(
                seq=seq if isinstance(seq, int) else index,
                at=at,
                app=str(row.get("app") or ""),
                op=str(row.get("op") or ""),
                table=str(row.get("table") or row.get("table_name") or "agent_runs"),
                run_id=None if run_id is None else str(run_id),
                txid=row.get("txid"),
                new=new,
                old=old,
            )
        )
    return sorted(changes, key=lambda c: (c.at, c.seq))


# --------------------------------------------------------------- building
class _Builder:
    def __init__(self, archive: Mapping[str, Any]) -> None:
        self.archive = archive
        self.events = _events(archive)
        self.ops: list[Operation] = operations(self.events)
        self.hits = _dicts(archive.get("control_hits"))
        self.signals = _dicts(archive.get("signals"))
        self.faults = _dicts(archive.get("faults"))
        self.audit = audit_changes(archive)
        self.spans: list[Span] = []
        self.marks: list[Mark] = []
        self.moments: list[Moment] = []
        self.workers = self._workers()

    def _workers(self) -> list[str]:
        """Worker ids in order of first appearance in what the harness saw or
        was told (histories, barrier hits, signals)."""
        seen: list[tuple[float, str]] = []
        for e in self.events:
            seen.append((e.time, e.worker))
        for h in self.hits:
            if (at := timestamp(h.get("received_at"))) is not None and h.get("worker"):
                seen.append((at, str(h["worker"])))
        for s in self.signals:
            if (at := timestamp(s.get("sent_at"))) is not None and s.get("process"):
                seen.append((at, _process_worker(str(s["process"]))))
        order: list[str] = []
        for _, worker in sorted(seen, key=lambda t: t[0]):
            if worker not in order:
                order.append(worker)
        return order

    def moment(self, at: float | None, text: str, source: Source) -> None:
        if at is not None:
            self.moments.append(Moment(at, text, source))

    # ---------------------------------------------------------- workers
    def worker_facts(self) -> None:
        for o in self.ops:
            invoke, done = o.invoke, o.completion
            e = done or invoke
            what = _op_words(e)
            outcome = o.outcome if done is not None else "none"
            label = _op_label(e, outcome)
            detail = f"{e.worker} {e.op}: {what}; outcome {outcome}"
            if done is None:
                detail += " (no answer was ever written: the worker died or was cut off)"
            self.marks.append(
                Mark(
                    lane=worker_lane(e.worker),
                    row="operations",
                    at=e.time,
                    kind="write" if e.op in WRITE_OPS else "op",
                    label=label,
                    detail=detail,
                    source="worker",
                    outcome=outcome,
                    since=invoke.time if done is not None and done is not invoke else None,
                    owner=e.worker,
                )
            )
            if done is not None and done.error and outcome in ("fail", "info"):
                verb = "rejected" if outcome == "fail" else "outcome unknown"
                self.moment(done.time, f"{e.worker} {e.op} {verb}: {done.error} ({what})", "worker")

    def signal_facts(self) -> None:
        stopped: dict[tuple[str, Any], float] = {}
        for s in sorted(self.signals, key=lambda s: timestamp(s.get("sent_at")) or 0.0):
            at = timestamp(s.get("confirmed_at")) or timestamp(s.get("sent_at"))
            if at is None:
                continue
            worker = _process_worker(str(s.get("process", "?")))
            signal = str(s.get("signal", "?"))
            state = str(s.get("state", "?"))
            detail = f"{signal} to {worker} (pid {s.get('pid')}): kernel state {state!r}" + (
                f"; {s.get('detail')}" if s.get("detail") else ""
            )
            self.marks.append(
                Mark(HARNESS, "signals", at, "signal", f"{signal} {worker}", detail, "harness")
            )
            self.moment(at, f"{signal} {worker}: the kernel reports {state}", "harness")
            key = (worker, s.get("pid"))
            if signal == "SIGSTOP":
                stopped[key] = at
            elif signal == "SIGCONT" and key in stopped:
                self._stopped(worker, stopped.pop(key), at, s)
            elif signal == "SIGKILL":
                if key in stopped:
                    self._stopped(worker, stopped.pop(key), at, s)
                self._killed(worker, at, s.get("pid"), f"SIGKILL: {state}", "SIGKILL")
        for (worker, pid), since in stopped.items():
            self.spans.append(
                Span(
                    worker_lane(worker),
                    "operations",
                    since,
                    None,
                    "stopped",
                    f"{worker} stopped",
                    f"{worker} (pid {pid}) stopped by SIGSTOP and never resumed in this picture",
                    "harness",
                    owner=worker,
                    fault="stopped",
                )
            )

    def _stopped(self, worker: str, since: float, until: float, s: Mapping[str, Any]) -> None:
        self.spans.append(
            Span(
                worker_lane(worker),
                "operations",
                since,
                until,
                "stopped",
                f"{worker} stopped (SIGSTOP)",
                f"{worker} (pid {s.get('pid')}) stopped in the kernel for "
                f"{1000 * (until - since):.0f} ms (SIGSTOP, then {s.get('signal')})",
                "harness",
                owner=worker,
                fault="stopped",
            )
        )

    def _killed(self, worker: str, at: float, pid: Any, how: str, what: str) -> None:
        # Until the worker id speaks again from another process, if it does.
        later = [e.time for e in self.events if e.worker == worker and e.time > at and e.pid != pid]
        self.spans.append(
            Span(
                worker_lane(worker),
                "operations",
                at,
                min(later) if later else None,
                "killed",
                f"{worker} killed ({what})",
                f"{worker} (pid {pid}) killed: {how}",
                "harness",
                owner=worker,
                fault="killed",
            )
        )

    def hit_facts(self) -> None:
        for h in self.hits:
            at = timestamp(h.get("received_at"))
            if at is None:
                continue
            worker = str(h.get("worker", "?"))
            point = str(h.get("point", "?"))
            action = str(h.get("action", "?"))
            pid = h.get("peer_pid") if h.get("peer_pid") is not None else h.get("pid")
            where = _fields(h)
            detail = f"{worker} reached @{point} ({where}; kernel pid {pid}); answer: {action}"
            released = timestamp(h.get("released_at"))
            if action == "hold":
                answer = h.get("released_with") or "never released"
                self.spans.append(
                    Span(
                        HARNESS,
                        "barriers",
                        at,
                        released,
                        "hold",
                        f"{worker} held @{point} → {answer}",
                        f"{detail}; released with {answer}",
                        "harness",
                        owner=worker,
                    )
                )
                self.moment(at, f"{worker} reaches @{point} and is held there", "harness")
                self.moment(released, f"{worker} released from @{point}: {answer}", "harness")
                if answer == "crash" and released is not None:
                    self._killed(worker, released, pid, f"crash answer at @{point}", "crash")
            else:
                label = f"{worker} @{point} → {action}" if action != "continue" else ""
                self.marks.append(
                    Mark(
                        HARNESS,
                        "barriers",
                        at,
                        "hit",
                        label,
                        detail,
                        "harness",
                        action,
                        owner=worker,
                    )
                )
                if action != "continue":
                    self.moment(
                        at, f"{worker} reaches @{point}; the harness answers {action}", "harness"
                    )
                if action == "crash":
                    self._killed(worker, at, pid, f"crash answer at @{point}", "crash")

    def link_facts(self) -> None:
        for f in self.faults:
            start = timestamp(f.get("started_at"))
            if start is None:
                continue
            stop = timestamp(f.get("stopped_at"))
            link = str(f.get("link", "?"))
            key = (m.group("key") if (m := LINK_NAME.match(link)) else link).replace("_", " ")
            kind = str(f.get("kind", "fault"))
            detail = str(f.get("detail") or f"{kind} on {link}")
            label = f"{kind} {key}"
            self.spans.append(
                Span(HARNESS, "links", start, stop, "link", label, detail, "harness", fault="link")
            )
            self.moment(start, f"link {key}: {detail}", "harness")
            self.moment(stop, f"link {key} healed ({kind} removed)", "harness")

    def action_facts(self) -> None:
        for c in _dicts(self.archive.get("commands_executed")):
            at = timestamp(c.get("time"))
            command = str(c.get("command", ""))
            if at is None or not command:
                continue
            if REPLY_COMMAND.match(command) or SIGNAL_COMMAND.match(command):
                continue  # drawn from the worker's history and the signal records
            if command.startswith(COVERED_COMMANDS):
                continue  # drawn from the fault journal and the barrier hits
            label = command if len(command) <= 48 else command[:47] + "…"
            self.marks.append(Mark(HARNESS, "actions", at, "action", label, command, "harness"))
            self.moment(at, f"the harness: {command}", "harness")

    # ---------------------------------------------------------- database
    def database_facts(self, end: float) -> list[str]:
        """Epoch bars and accepted writes per run, from the audit trail; returns the row names."""
        rows: list[str] = []
        runs: dict[str, list[AuditChange]] = {}
        others: list[AuditChange] = []
        for c in self.audit:
            if c.table == "agent_runs" and c.run_id is not None:
                runs.setdefault(c.run_id, []).append(c)
            else:
                others.append(c)
        for run_id, changes in runs.items():
            row = f"run {short(run_id)}"
            rows.append(row)
            self._run_row(row, run_id, changes, end)
        for c in others:
            if "other tables" not in rows:
                rows.append("other tables")
            self.marks.append(
                Mark(
                    DATABASE,
                    "other tables",
                    c.at,
                    "row",
                    f"{c.table} {c.op.lower()}",
                    f"{c.table} {c.op} by {c.app or '?'}: {dict(c.new) or dict(c.old)}",
                    "database",
                )
            )
        if self._failover():
            rows.append("failover")
        return rows

    def _run_row(self, row: str, run_id: str, changes: Sequence[AuditChange], end: float) -> None:
        tenure: dict[str, Any] | None = None
        tenures: list[dict[str, Any]] = []
        for c in changes:
            new, old = c.new, c.old
            owner, epoch = new.get("owner"), new.get("epoch")
            if c.op == "INSERT":
                self.marks.append(
                    Mark(
                        DATABASE,
                        row,
                        c.at,
                        "status",
                        "",
                        f"run {run_id} created ({new.get('status')}) by {c.app}",
                        "database",
                    )
                )
                if owner is None:
                    continue
            granted = owner is not None and (
                epoch != old.get("epoch") or owner != old.get("owner") or tenure is None
            )
            if granted:
                if tenure is not None:
                    tenure["end"] = c.at
                tenure = {
                    "owner": owner,
                    "epoch": epoch,
                    "start": c.at,
                    "lease": timestamp(new.get("lease_expires_at")),
                    "end": None,
                    "renewals": 0,
                    "app": c.app,
                }
                tenures.append(tenure)
            elif tenure is not None and owner is None and old.get("owner") is not None:
                tenure["end"] = c.at
                self.marks.append(
                    Mark(
                        DATABASE,
                        row,
                        c.at,
                        "status",
                        "released",
                        f"{old.get('owner')} released epoch {old.get('epoch')} (by {c.app})",
                        "database",
                    )
                )
                self.moment(
                    c.at, f"{old.get('owner')} releases epoch {old.get('epoch')}", "database"
                )
                tenure = None
            elif tenure is not None:
                lease = timestamp(new.get("lease_expires_at"))
                if lease is not None and lease != tenure["lease"]:
                    tenure["lease"] = lease
                    tenure["renewals"] += 1
            if new.get("revision") != old.get("revision") and new.get("revision") is not None:
                # Drawn in the colour of the connection that wrote it: a write
                # by anyone but the holder stands out on the holder's bar.
                holder = owner_worker(owner)
                writer = c.app if c.app in self.workers else holder
                self.marks.append(
                    Mark(
                        DATABASE,
                        row,
                        c.at,
                        "accepted",
                        f"r{new.get('revision')}" + ("" if writer == holder else f" by {writer}"),
                        f"revision {old.get('revision')} → {new.get('revision')} accepted at "
                        f"epoch {epoch} (owner {owner}) from connection {c.app}, txid "
                        f"{c.txid}",
                        "database",
                        outcome="accepted",
                        owner=writer,
                    )
                )
                if writer != holder:
                    self.moment(
                        c.at,
                        f"the database accepts revision {new.get('revision')} from {writer}'s "
                        f"connection while {holder} holds epoch {epoch}",
                        "database",
                    )
            if new.get("status") != old.get("status") and not granted:
                self.marks.append(
                    Mark(
                        DATABASE,
                        row,
                        c.at,
                        "status",
                        str(new.get("status")),
                        f"status {old.get('status')} → {new.get('status')} (by {c.app})",
                        "database",
                    )
                )
        activity = [c.at for c in changes]
        for t in tenures:
            self._tenure(row, run_id, t, end, activity)

    def _tenure(
        self, row: str, run_id: str, t: dict[str, Any], end: float, activity: Sequence[float]
    ) -> None:
        worker = owner_worker(t["owner"]) or "?"
        until, lease = t["end"], t["lease"]
        renewed = f", renewed {t['renewals']} times" if t["renewals"] else ""
        lease_text = (
            f"lease until {lease - t['start']:+.3f} s from the grant" if lease else "no lease"
        )
        self.spans.append(
            Span(
                DATABASE,
                row,
                t["start"],
                until,
                "epoch",
                f"{worker} e{t['epoch']}",
                f"{t['owner']} holds epoch {t['epoch']} of run {run_id} ({lease_text}{renewed}); "
                f"granted in a transaction of connection {t['app']}",
                "database",
                owner=worker,
            )
        )
        self.moment(
            t["start"], f"{worker} gets epoch {t['epoch']} of run {short(run_id)}", "database"
        )
        stop = until if until is not None else end
        if lease is not None and lease < stop:
            self.spans.append(
                Span(
                    DATABASE,
                    row,
                    lease,
                    until,
                    "expired",
                    "expired",
                    f"{t['owner']}'s lease on epoch {t['epoch']} expired by database time; "
                    "the epoch is still the run's newest until someone takes it over",
                    "database",
                    owner=worker,
                )
            )
            later_failures = any(
                o.outcome == "fail" and (o.completion or o.invoke).run_id == run_id
                for o in self.ops
                if (o.completion or o.invoke).time > lease
            )
            if until is not None or later_failures or any(a > lease for a in activity):
                self.moment(
                    lease,
                    f"{worker}'s lease on epoch {t['epoch']} expires by database time",
                    "database",
                )

    def _failover(self) -> bool:
        failover = self.archive.get("failover")
        if not isinstance(failover, dict):
            return False
        record = mapping(failover.get("record"))
        mode = failover.get("replication_mode", "?")
        lag = _lag(failover)
        contract = failover.get("declared_contract")
        guarantee = contract.get("guarantee", "") if isinstance(contract, dict) else ""
        lost = failover.get("acknowledged_write_lost")
        before, after = failover.get("before"), failover.get("after")
        detail = (
            f"replication {mode}; standby lag before: {lag}; acknowledged write lost: {lost}; "
            f"before: {_run_state(before)}; after: {_run_state(after)}; declared: {guarantee}"
        )
        fenced = timestamp(record.get("fenced_at"))
        promoted = timestamp(record.get("promoted_at"))
        if fenced is not None:
            self.marks.append(
                Mark(
                    DATABASE,
                    "failover",
                    fenced,
                    "failover",
                    "old primary fenced",
                    detail,
                    "harness",
                )
            )
            self.moment(fenced, f"failover: old primary fenced ({mode} replication)", "harness")
        if promoted is not None:
            self.marks.append(
                Mark(
                    DATABASE,
                    "failover",
                    promoted,
                    "failover",
                    f"standby promoted ({mode}, lag {lag})",
                    detail,
                    "harness",
                )
            )
            self.moment(
                promoted,
                f"failover: standby promoted ({mode}; lag before {lag}; acknowledged write "
                f"lost: {lost}); run before {_run_state(before)}, after {_run_state(after)}",
                "harness",
            )
        return fenced is not None or promoted is not None

    # ---------------------------------------------------------- tool
    def tool_facts(self) -> list[str]:
        rows: list[str] = []
        for r in _dicts(self.archive.get("mock_tool_request_log")):
            received = timestamp(r.get("received_at"))
            if received is None:
                continue
            done = timestamp(r.get("completed_at"))
            outcome = str(r.get("outcome") or r.get("error") or "?")
            label = f"{r.get('tool', '?')} {outcome} {r.get('http_status') or ''}".strip()
            detail = (
                f"request #{r.get('seq')} to {r.get('tool')}: {outcome} (HTTP "
                f"{r.get('http_status')}); operation {r.get('operation_id')}; run "
                f"{r.get('run_id')} epoch {r.get('epoch')}"
                + (f"; fault {r.get('fault_mode')}" if r.get("fault_mode") else "")
            )
            self.marks.append(
                Mark(
                    TOOL,
                    "requests",
                    done if done is not None else received,
                    "request",
                    label,
                    detail,
                    "tool",
                    outcome=outcome,
                    since=received if done is not None else None,
                )
            )
            _add(rows, "requests")
        for r in _dicts(self.archive.get("mock_tool_resources")):
            at = timestamp(r.get("created_at"))
            if at is None:
                continue
            rid = str(r.get("resource_id", "?"))
            self.marks.append(
                Mark(
                    TOOL,
                    "resources",
                    at,
                    "resource",
                    f"{short(rid, 12)} created",
                    f"resource {rid} created by {r.get('tool')} for operation "
                    f"{r.get('operation_id')} (request #{r.get('request_seq')})",
                    "tool",
                )
            )
            self.moment(at, f"the tool creates resource {short(rid, 12)}", "tool")
            _add(rows, "resources")
        for m in _dicts(self.archive.get("broker_messages")):
            at = timestamp(m.get("received_at"))
            if at is None:
                continue
            dup = m.get("duplicate_of")
            label = f"{m.get('topic', 'message')}" + (f" (repeat of #{dup})" if dup else "")
            self.marks.append(
                Mark(
                    TOOL,
                    "broker",
                    at,
                    "message",
                    label,
                    f"broker message #{m.get('seq')} event {m.get('event_id')} topic "
                    f"{m.get('topic')}" + (f", a repeat of #{dup}" if dup else ""),
                    "tool",
                )
            )
            if dup:
                self.moment(
                    at, f"the broker receives event {short(m.get('event_id'))} again", "tool"
                )
            _add(rows, "broker")
        return rows


def build_picture(archive: Mapping[str, Any]) -> Picture:
    """Every fact of ``archive`` the timeline draws, with its lanes and key moments."""
    b = _Builder(archive)
    b.worker_facts()
    b.signal_facts()
    b.hit_facts()
    b.link_facts()
    b.action_facts()
    times = [m.at for m in b.marks] + [m.since for m in b.marks if m.since is not None]
    times += [s.start for s in b.spans] + [s.end for s in b.spans if s.end is not None]
    times += [c.at for c in b.audit]
    end_guess = max(times) if times else 0.0
    db_rows = b.database_facts(end_guess)
    tool_rows = b.tool_facts()
    times = [m.at for m in b.marks] + [s.start for s in b.spans]
    times += [s.end for s in b.spans if s.end is not None and s.kind != "expired"]
    start = min(times) if times else 0.0
    end = max(times) if times else 1.0
    if end - start < 0.001:
        end = start + 1.0
    harness_rows = [r for r in ("signals", "links", "barriers", "actions") if _used(b, HARNESS, r)]
    lanes = [Lane(HARNESS, "harness", tuple(harness_rows) or ("signals",))]
    lanes += [Lane(worker_lane(w), f"worker {w}", ("operations",), worker=w) for w in b.workers]
    lanes.append(Lane(DATABASE, "PostgreSQL (audit)", tuple(db_rows) or ("runs",)))
    lanes.append(Lane(TOOL, "mock tool", tuple(tool_rows) or ("requests",)))
    moments = sorted(b.moments, key=lambda m: m.at)
    return Picture(start, end, lanes, b.spans, b.marks, moments, b.workers)


def _used(b: _Builder, lane: str, row: str) -> bool:
    return any(m.lane == lane and m.row == row for m in b.marks) or any(
        s.lane == lane and s.row == row for s in b.spans
    )


def _add(rows: list[str], row: str) -> None:
    if row not in rows:
        rows.append(row)


def _process_worker(process: str) -> str:
    return process.removeprefix("worker-")


def _fields(obj: Mapping[str, Any]) -> str:
    parts = [
        f"{name} {short(obj.get(key)) if key.endswith('_id') else obj.get(key)}"
        for key, name in (
            ("run_id", "run"),
            ("epoch", "epoch"),
            ("revision", "rev"),
            ("operation_id", "op"),
        )
        if obj.get(key) is not None
    ]
    return ", ".join(parts) or "no run"


def _op_words(e: Event) -> str:
    return _fields(
        {
            "run_id": e.run_id,
            "epoch": e.epoch,
            "revision": e.revision,
            "operation_id": e.operation_id,
        }
    )


def _op_label(e: Event, outcome: str) -> str:
    if outcome == "fail":
        return f"{e.op} ✗ {e.error or 'failed'}"
    if outcome in ("info", "none"):
        return f"{e.op} ? {e.error or 'no answer'}"
    if e.op == "claim" and e.epoch is not None:
        return f"claim e{e.epoch}"
    if e.op in WRITE_OPS and e.revision is not None:
        return f"{e.op} r{e.revision}"
    if e.op in ("renew", "heartbeat"):
        return ""  # many and uneventful: the tooltip has them
    return e.op


def _lag(failover: Mapping[str, Any]) -> str:
    rows = failover.get("replication_before")
    if isinstance(rows, list) and rows and isinstance(rows[0], dict):
        r = rows[0]
        return (
            f"{r.get('replay_lag_bytes', '?')} B replay, {r.get('flush_lag_bytes', '?')} B flush "
            f"({r.get('sync_state', '?')})"
        )
    record = failover.get("record")
    if isinstance(record, dict) and record.get("lag_before"):
        return str(record["lag_before"])
    return "not recorded"


def _run_state(state: Any) -> str:
    if not isinstance(state, dict):
        return "not recorded"
    run = mapping(state.get("run"))
    return (
        f"epoch {run.get('epoch')} rev {run.get('revision')} {run.get('status')} "
        f"on {state.get('server', '?')}"
    )


def counts(items: Iterable[Span]) -> dict[str, int]:
    """Fault spans by kind (for summaries and tests)."""
    out = dict.fromkeys(FAULT_KINDS, 0)
    for s in items:
        if s.fault:
            out[s.fault] += 1
    return out

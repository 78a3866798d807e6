"""Worker event histories: loading, merging, pairing and a readable timeline.

Each worker appends its account of what it tried and what came of it to its
own JSON-lines file (worker contract, section 4). This module merges those
files into one history ordered by time and renders it, together with the
harness's own evidence (control hits, link faults, process signals), as the
timeline `fencecheck show` prints.

Invariants:
- Within one file, events keep the order they were written in even if the
  wall clock stepped back: files are merged, never re-sorted internally.
- A line that cannot be read is skipped and reported as a `HistoryProblem`,
  never fatal: a torn last line is what SIGKILL legitimately leaves behind;
  a bad line elsewhere is a contract violation and reported as such.
- The history is the worker's account, not proof; checkers compare it with
  the database, the tool's log and what the harness saw itself.
"""

from __future__ import annotations

import heapq
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.parts.control import Hit, _opt_int, _opt_str
from harness.parts.processes import SignalRecord
from harness.parts.toxiproxy import FaultRecord

log = logging.getLogger(__name__)

EVENT_TYPES = ("invoke", "ok", "fail", "info")
COMPLETION_TYPES = ("ok", "fail", "info")


@dataclass(frozen=True)
class Event:
    """One line of a worker's history (contract section 4) plus where it came from."""

    time: float
    worker: str
    pid: int | None
    type: str
    op: str
    run_id: str | None = None
    epoch: int | None = None
    revision: int | None = None
    operation_id: str | None = None
    event_id: str | None = None
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    line: int = 0

    @classmethod
    def from_json(cls, obj: dict[str, Any], source: str = "", line: int = 0) -> Event:
        """Build from a decoded line; KeyError/ValueError if a required field is bad."""
        event_type = str(obj["type"])
        if event_type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {event_type!r}")
        detail = obj.get("detail")
        return cls(
            time=float(obj["time"]),
            worker=str(obj["worker"]),
            pid=_opt_int(obj.get("pid")),
            type=event_type,
            op=str(obj["op"]),
            run_id=_opt_str(obj.get("run_id")),
            epoch=_opt_int(obj.get("epoch")),
            revision=_opt_int(obj.get("revision")),
            operation_id=_opt_str(obj.get("operation_id")),
            event_id=_opt_str(obj.get("event_id")),
            error=_opt_str(obj.get("error")),
            detail=detail if isinstance(detail, dict) else {},
            source=source,
            line=line,
        )


@dataclass(frozen=True)
class HistoryProblem:
    """A line that was skipped: `kind` is 'torn' (unterminated last line) or 'malformed'."""

    source: str
    line: int
    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.kind} line skipped: {self.text[:120]!r}"


@dataclass(frozen=True)
class History:
    """Merged events plus every problem met while reading them."""

    events: list[Event]
    problems: list[HistoryProblem]


def _read_file(path: Path, problems: list[HistoryProblem]) -> list[Event]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        # A worker that never recorded anything may never have created its file.
        return []
    events: list[Event] = []
    lines = data.split(b"\n")
    # Everything after the last newline is an unterminated tail.
    tail = lines.pop()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        event = _parse(raw, str(path), number, "malformed", problems)
        if event is not None:
            events.append(event)
    if tail.strip():
        event = _parse(tail, str(path), len(lines) + 1, "torn", problems)
        if event is not None:
            events.append(event)
    return events


def _parse(
    raw: bytes, source: str, line: int, kind: str, problems: list[HistoryProblem]
) -> Event | None:
    text = raw.decode("utf-8", errors="replace")
    try:
        obj = json.loads(text)
        if not isinstance(obj, dict):
            raise ValueError("not an object")
        return Event.from_json(obj, source, line)
    except (ValueError, KeyError, TypeError):
        problems.append(HistoryProblem(source, line, kind, text))
        return None


def read_history(paths: Iterable[Path | str]) -> History:
    """Load and merge several history files by time; never raises on bad lines."""
    problems: list[HistoryProblem] = []
    per_file = [_read_file(Path(p), problems) for p in paths]
    # heapq.merge keeps each file's own order and interleaves by time.
    merged = list(heapq.merge(*per_file, key=lambda e: e.time))
    return History(merged, problems)


def load_history(paths: Iterable[Path | str]) -> list[Event]:
    """Merged events of several files; skipped lines are logged as warnings."""
    history = read_history(paths)
    for problem in history.problems:
        log.warning("history: %s", problem)
    return history.events


def select(
    events: Iterable[Event],
    *,
    worker: str | None = None,
    op: str | None = None,
    type: str | None = None,
    run_id: str | None = None,
) -> list[Event]:
    """Events matching every given field."""
    return [
        e
        for e in events
        if (worker is None or e.worker == worker)
        and (op is None or e.op == op)
        and (type is None or e.type == type)
        and (run_id is None or e.run_id == run_id)
    ]


@dataclass(frozen=True)
class Operation:
    """An invoke and its completion; `completion` None means no answer was ever written.

    An operation without completion (its worker was killed) counts as
    `info`: it may or may not have happened.
    """

    invoke: Event
    completion: Event | None

    @property
    def outcome(self) -> str:
        return self.completion.type if self.completion is not None else "info"


def operations(events: Sequence[Event]) -> list[Operation]:
    """Pair each invoke with the next completion of the same op by the same process.

    Pairing is FIFO per (worker, pid, op); completions with no invoke are
    returned as operations of their own whose invoke is the completion.
    """
    open_ops: dict[tuple[str, int | None, str], list[int]] = {}
    result: list[Operation] = []
    for event in events:
        key = (event.worker, event.pid, event.op)
        if event.type == "invoke":
            open_ops.setdefault(key, []).append(len(result))
            result.append(Operation(event, None))
        elif open_ops.get(key):
            index = open_ops[key].pop(0)
            result[index] = Operation(result[index].invoke, event)
        else:
            result.append(Operation(event, event))
    return result


# -- timeline --------------------------------------------------------------


Shorten = Callable[[str | None], str]


def id_shortener(values: Iterable[str | None], minimum: int = 8) -> Shorten:
    """A function that cuts each of ``values`` to the shortest prefix of at least
    ``minimum`` characters that no other of them shares (``..`` marks a cut),
    so ids with a common prefix (operation ids of one tenant and run, uuids
    that happen to agree) stay distinguishable; a value not among ``values``
    is cut to ``minimum``."""
    distinct = sorted({v for v in values if v})
    needed: dict[str, int] = {}
    for i, value in enumerate(distinct):
        length = minimum
        for other in distinct[max(0, i - 1) : i] + distinct[i + 1 : i + 2]:
            common = next(
                (k for k, (a, b) in enumerate(zip(value, other, strict=False)) if a != b),
                min(len(value), len(other)),
            )
            length = max(length, common + 1)
        needed[value] = length

    def shorten(value: str | None) -> str:
        if value is None:
            return "-"
        n = needed.get(value, minimum)
        return value if len(value) <= n else value[:n] + ".."

    return shorten


def _fields(
    shorten: Shorten,
    run_id: str | None,
    epoch: int | None,
    revision: int | None,
    operation_id: str | None,
) -> str:
    parts = []
    if run_id is not None:
        parts.append(f"run={shorten(run_id)}")
    if epoch is not None:
        parts.append(f"epoch={epoch}")
    if revision is not None:
        parts.append(f"rev={revision}")
    if operation_id is not None:
        parts.append(f"op_id={shorten(operation_id)}")
    return " ".join(parts)


def _event_line(e: Event, shorten: Shorten) -> str:
    text = f"{e.worker} {e.type} {e.op}"
    rest = _fields(shorten, e.run_id, e.epoch, e.revision, e.operation_id)
    if e.event_id is not None:
        rest += f" event={shorten(e.event_id)}"
    if e.error:
        rest += f" error={e.error}"
    return f"{text} {rest}".rstrip()


def _hit_lines(h: Hit, shorten: Shorten) -> Iterator[tuple[float, str]]:
    where = _fields(shorten, h.run_id, h.epoch, h.revision, h.operation_id)
    pid = h.peer_pid if h.peer_pid is not None else h.pid
    yield h.received_at, f"{h.worker} @{h.point} {where} pid={pid} -> {h.action}".replace("  ", " ")
    if h.released_at is not None:
        yield h.released_at, f"{h.worker} @{h.point} released: {h.released_with}"


def _fault_lines(f: FaultRecord) -> Iterator[tuple[float, str]]:
    yield f.started_at, f"fault start: {f.detail or f.kind + ' ' + f.link}"
    if f.stopped_at is not None:
        yield f.stopped_at, f"fault stop: {f.kind} on link {f.link}"


def _signal_lines(s: SignalRecord) -> Iterator[tuple[float, str]]:
    when = s.confirmed_at if s.confirmed_at is not None else s.sent_at
    latency = (
        f", confirmed {1000 * (s.confirmed_at - s.sent_at):.1f}ms after sending"
        if s.confirmed_at is not None
        else ""
    )
    detail = f" ({s.detail})" if s.detail else ""
    yield when, f"{s.process} {s.signal} -> {s.state}{latency}{detail} pid={s.pid}"


def timeline_ids(events: Iterable[Event], hits: Iterable[Hit] = ()) -> list[str | None]:
    """Every id a timeline of ``events`` and ``hits`` shows."""
    ids: list[str | None] = []
    for e in events:
        ids += [e.run_id, e.operation_id, e.event_id]
    for h in hits:
        ids += [h.run_id, h.operation_id]
    return ids


def timeline(
    events: Iterable[Event],
    hits: Iterable[Hit] = (),
    faults: Iterable[FaultRecord] = (),
    *,
    signals: Iterable[SignalRecord] = (),
    notes: Iterable[tuple[float, str]] = (),
    shorten: Shorten | None = None,
) -> list[str]:
    """One line per entry, ordered by time, as '+412ms A ok claim run=1f2a0b6c.. epoch=4'.

    Times are milliseconds from the first entry. Ties keep the order
    events, hits, faults, signals (a worker's own line before the harness's
    reaction to it). Harness-observed lines are marked with '*'. Ids are
    cut only as far as they stay distinguishable (``shorten``; by default
    made from every id of the events and hits).
    """
    events, hits = list(events), list(hits)
    if shorten is None:
        shorten = id_shortener(timeline_ids(events, hits))
    entries: list[tuple[float, int, int, str]] = []
    order = 0

    def add(when: float, group: int, text: str) -> None:
        nonlocal order
        entries.append((when, group, order, text))
        order += 1

    for e in events:
        add(e.time, 0, "  " + _event_line(e, shorten))
    for h in hits:
        for when, text in _hit_lines(h, shorten):
            add(when, 1, "* " + text)
    for f in faults:
        for when, text in _fault_lines(f):
            add(when, 2, "* " + text)
    for s in signals:
        for when, text in _signal_lines(s):
            add(when, 3, "* " + text)
    for when, text in notes:
        add(when, 4, "* " + text)
    if not entries:
        return []
    entries.sort(key=lambda t: (t[0], t[1], t[2]))
    start = entries[0][0]
    return [f"+{round(1000 * (when - start)):>6}ms {text}" for when, _, _, text in entries]

"""Event recording (harness.injection.record) and history loading/merging/rendering."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import injection
from harness.checking.history import (
    Event,
    id_shortener,
    load_history,
    operations,
    read_history,
    select,
    timeline,
)
from harness.parts.control import Hit
from harness.parts.processes import SignalRecord
from harness.parts.toxiproxy import FaultRecord


def line(t: float, worker: str, type: str, op: str, **extra: object) -> str:
    obj = {"time": t, "worker": worker, "pid": 1, "type": type, "op": op, **extra}
    return json.dumps(obj) + "\n"


@pytest.fixture
def recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "A.events.jsonl"
    monkeypatch.setenv("FENCECHECK_EVENTS", str(path))
    monkeypatch.setenv("FENCECHECK_WORKER_ID", "A")
    monkeypatch.delenv("FENCECHECK_CONTROL", raising=False)
    injection.reload_environment()
    yield path
    monkeypatch.delenv("FENCECHECK_EVENTS")
    injection.reload_environment()


def test_record_writes_contract_lines_from_many_threads(recording: Path) -> None:
    def work(n: int) -> None:
        for i in range(200):
            injection.record("invoke", "save_checkpoint", run_id=f"r{n}", epoch=n, revision=i,
                             detail={"blob": "x" * 500})  # fmt: skip

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    injection.record("fail", "renew", error=TimeoutError("late"), event_id=object())
    history = read_history([recording])
    assert history.problems == []
    assert len(history.events) == 8 * 200 + 1
    last = history.events[-1]
    assert (last.worker, last.type, last.op, last.error) == ("A", "fail", "renew", "TimeoutError")
    assert set(json.loads(recording.read_text().splitlines()[0])) == {
        "time", "worker", "pid", "type", "op", "run_id", "epoch", "revision",
        "operation_id", "event_id", "error", "detail",
    }  # fmt: skip


def test_record_rejects_unknown_types(recording: Path) -> None:
    with pytest.raises(ValueError, match="invoke"):
        injection.record("done", "claim")


def test_record_is_a_no_op_without_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FENCECHECK_EVENTS", raising=False)
    injection.reload_environment()
    injection.record("ok", "claim")
    assert list(tmp_path.iterdir()) == []


def test_merge_of_two_files_by_time_keeps_each_file_order(tmp_path: Path) -> None:
    a, b = tmp_path / "A.jsonl", tmp_path / "B.jsonl"
    a.write_text(line(1.0, "A", "invoke", "claim") + line(3.0, "A", "ok", "claim")
                 + line(2.5, "A", "invoke", "renew"))  # fmt: skip
    b.write_text(line(2.0, "B", "invoke", "claim") + line(4.0, "B", "ok", "claim"))
    events = load_history([a, b])
    assert [(e.time, e.worker) for e in events] == [
        (1.0, "A"), (2.0, "B"), (3.0, "A"), (2.5, "A"), (4.0, "B"),
    ]  # fmt: skip
    assert [e.line for e in select(events, worker="A")] == [1, 2, 3]
    assert len(select(events, op="claim", type="ok")) == 2


def test_torn_last_line_is_skipped_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "A.jsonl"
    path.write_text(line(1.0, "A", "invoke", "save") + '{"time": 2.0, "worker": "A", "ty')
    history = read_history([path, tmp_path / "never-written.jsonl"])
    assert [e.op for e in history.events] == ["save"]
    assert [(p.kind, p.line) for p in history.problems] == [("torn", 2)]
    assert "torn line skipped" in str(history.problems[0])


def test_malformed_middle_line_is_reported_as_such(tmp_path: Path) -> None:
    path = tmp_path / "A.jsonl"
    path.write_text(line(1.0, "A", "invoke", "save") + "garbage\n" + line(2.0, "A", "ok", "save"))
    history = read_history([path])
    assert len(history.events) == 2
    assert [(p.kind, p.line) for p in history.problems] == [("malformed", 2)]


def test_operations_pair_invokes_with_completions() -> None:
    events = [
        Event(1.0, "A", 1, "invoke", "save"),
        Event(2.0, "B", 2, "invoke", "save"),
        Event(3.0, "A", 1, "ok", "save"),
        Event(4.0, "A", 1, "invoke", "renew"),
    ]
    ops = operations(events)
    assert [(o.invoke.worker, o.invoke.op, o.outcome) for o in ops] == [
        ("A", "save", "ok"), ("B", "save", "info"), ("A", "renew", "info"),
    ]  # fmt: skip


def test_timeline_merges_worker_and_harness_evidence() -> None:
    t0 = 1000.0
    events = [
        Event(t0, "A", 1, "ok", "claim", run_id="1f2a3b4c5d6e", epoch=4),
        Event(t0 + 0.9, "B", 2, "fail", "save_checkpoint", epoch=5, error="LeaseLost"),
    ]
    hits = [Hit(0, t0 + 0.412, "A", 1, 1, 0, "before_commit", "1f2a3b4c5d6e", 4, 7, None,
                "hold", released_at=t0 + 0.8, released_with="continue")]  # fmt: skip
    faults = [FaultRecord("worker_pg", "cut", t0 + 0.5, t0 + 0.7, "cut link worker_pg (a -> b)")]
    signals = [SignalRecord("worker-A", 1, "pause", "SIGSTOP", t0 + 0.6, t0 + 0.601, "stopped")]
    lines = timeline(events, hits, faults, signals=signals)
    assert lines[0] == "+     0ms   A ok claim run=1f2a3b4c.. epoch=4"
    assert lines[1].startswith("+   412ms * A @before_commit run=1f2a3b4c.. epoch=4 rev=7")
    assert lines[1].endswith("-> hold")
    assert "cut link worker_pg (a -> b)" in lines[2]
    assert "SIGSTOP -> stopped" in lines[3] and lines[3].startswith("+   601ms")
    assert lines[4].startswith("+   700ms * fault stop: cut")
    assert "released: continue" in lines[5]
    assert lines[6].endswith("B fail save_checkpoint epoch=5 error=LeaseLost")
    assert timeline([]) == []


def test_timeline_ids_stay_distinguishable() -> None:
    tenant = "0b6c2f1e-aaaa-4bbb-8ccc-000000000000"
    ops = [f"{tenant}/run-1/create_label/v1", f"{tenant}/run-1/create_label/v2"]
    shorten = id_shortener([*ops, "deadbeef-1", "deadbeef-2", "cafe0001"])
    assert shorten(ops[0]) != shorten(ops[1])
    assert shorten(ops[0]).endswith("1") and shorten(ops[1]).endswith("2")
    assert shorten("deadbeef-1") != shorten("deadbeef-2")
    assert shorten("cafe0001") == "cafe0001"  # short enough: never cut
    assert shorten(None) == "-"
    assert shorten("not-seen-before-long-id") == "not-seen.."

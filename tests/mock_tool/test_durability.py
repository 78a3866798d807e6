"""The tool's log survives its own crash: nothing it acknowledged is lost."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from harness.waiting import wait_for
from mock_tool.client import CreateResult, ToolClient
from mock_tool.errors import ToolConflict, ToolError
from mock_tool.process import MockToolProcess
from mock_tool.storage import DB_FILE
from tests.mock_tool.helpers import rows_for

REQ = {"n": 1}


def _hammer(
    client: ToolClient, worker: int, stop: threading.Event
) -> tuple[list[tuple[str, CreateResult]], list[tuple[str, int]]]:
    """Create and publish until the tool dies; return only what was acknowledged."""
    tools = ("idem", "detid", "queryable", "plain")
    creates: list[tuple[str, CreateResult]] = []
    published: list[tuple[str, int]] = []
    i = 0
    while not stop.is_set():
        tool = tools[i % len(tools)]
        try:
            creates.append((tool, client.create(tool, f"w{worker}-op{i}", "r", 1, REQ)))
            event_id = f"w{worker}-ev{i}"
            published.append((event_id, client.publish(event_id, "topic", {"i": i})))
        except ToolError:
            break  # the tool is gone: whatever was not acked may or may not be there
        i += 1
    return creates, published


def test_sigkill_mid_load_loses_nothing_acknowledged(tool: MockToolProcess) -> None:
    client = tool.client(timeout_s=2.0)
    client.create("detid", "before-kill", "r", 1, REQ)
    stop = threading.Event()
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_hammer, client, w, stop) for w in range(4)]
        # Kill once real load is in flight, not before it started.
        wait_for(
            lambda: len(client.export()["requests"]) >= 40,
            what="40 logged requests",
            timeout_s=5,
        )
        before = client.export()
        tool.kill()
        stop.set()
        results = [f.result(timeout=10) for f in futures]
    tool.start()  # same storage, same port
    after = client.export()

    acked_creates = [c for creates, _ in results for c in creates]
    acked_messages = [m for _, published in results for m in published]
    assert acked_creates, "the load never got an acknowledgement"
    resources = {r["resource_id"]: r for r in after["resources"]}
    for _tool, ack in acked_creates:
        assert ack.resource_id in resources, f"acknowledged {ack} lost in the crash"
        assert resources[ack.resource_id]["operation_id"] == ack.operation_id
    messages = {m["seq"]: m for m in after["messages"]}
    for event_id, seq in acked_messages:
        assert messages[seq]["event_id"] == event_id, f"acknowledged message {seq} lost"

    # Everything the pre-kill export showed is still there, unchanged, except
    # requests then in flight: they either finished before the kill or are now
    # marked interrupted; none stays pending once the tool restarted.
    after_requests = {r["seq"]: r for r in after["requests"]}
    identity = ("received_at", "tool", "operation_id", "body_digest")
    for row in before["requests"]:
        kept = after_requests[row["seq"]]
        if row["outcome"] == "pending":
            assert [kept[k] for k in identity] == [row[k] for k in identity]
        else:
            assert kept == row
    assert all(r["outcome"] != "pending" for r in after["requests"])
    # Resources are listed by the seq of the request that made them, which is
    # not their commit order under concurrency: compare by id, not by position.
    after_resources = {r["resource_id"]: r for r in after["resources"]}
    for r in before["resources"]:
        assert after_resources.get(r["resource_id"]) == r, f"resource {r} changed or lost"
    assert before["messages"] == after["messages"][: len(before["messages"])]
    # Every resource has exactly one creating request in the log.
    creators = [r for r in after["requests"] if r["outcome"].startswith("created")]
    assert sorted(r["resource_id"] for r in creators) == sorted(resources)
    assert [b["boot"] for b in after["boots"]] == [1, 2]


def test_promises_hold_across_a_restart(tool: MockToolProcess) -> None:
    client = tool.client()
    idem = client.create("idem", "op-1", "r", 1, REQ)
    det = client.create("detid", "op-2", "r", 1, REQ)
    tool.restart(crash=True)
    # The idempotency key and the deterministic id were stored durably.
    replay = client.create("idem", "op-1", "r", 2, REQ)
    assert replay.replayed and replay.resource_id == idem.resource_id
    with pytest.raises(ToolConflict) as info:
        client.create("detid", "op-2", "r", 2, REQ)
    assert info.value.resource_id == det.resource_id
    assert len(client.export()["resources"]) == 2


def test_request_received_but_not_acted_is_marked_interrupted(tool: MockToolProcess) -> None:
    client = tool.client()
    client.set_fault("plain", "hang")
    impatient = tool.client(timeout_s=5.0)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(impatient.create, "plain", "op-hung", "r", 1, REQ)
        wait_for(lambda: client.faults()["hung"], what="the request to hang", timeout_s=5)
        tool.kill()
        with pytest.raises(ToolError):
            pending.result(timeout=10)
    tool.start()
    export = client.export()
    [row] = rows_for(export, "requests", "op-hung")
    assert row["outcome"] == "interrupted" and row["resource_id"] is None
    assert export["resources"] == []
    # Faults are not durable: the restarted tool acts normally.
    assert client.create("plain", "op-after", "r", 1, REQ).http_status == 201


def test_sigterm_is_a_clean_shutdown(tool: MockToolProcess) -> None:
    client = tool.client()
    client.create("idem", "op", "r", 1, REQ)
    client.publish("ev", "t", {})
    assert tool.stop() == 0
    assert "mock_tool: stopped" in tool.log_path.read_text()
    # A clean stop checkpoints the WAL into the main database file.
    wal = tool.storage / f"{DB_FILE}-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    tool.start()
    export: dict[str, Any] = client.export()
    assert len(export["resources"]) == 1 and len(export["messages"]) == 1


def test_restart_keeps_the_port(tmp_path: Path) -> None:
    with MockToolProcess(tmp_path / "s") as proc:
        port, pid = proc.port, proc.pid
        proc.restart()
        assert proc.port == port and proc.pid != pid
        assert proc.client().health()["server"]["boot"] == 2

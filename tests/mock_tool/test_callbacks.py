"""Callbacks arrive at a real receiver, are logged per attempt, and
``slow_callback`` delays them."""

from __future__ import annotations

import time
from typing import Any

from harness.waiting import wait_for
from mock_tool.client import ToolClient
from tests.mock_tool.helpers import CallbackReceiver, rows_for

REQ = {"x": 1}


def settled_callbacks(client: ToolClient, operation_id: str, n: int) -> list[dict[str, Any]]:
    """The callback log of ``operation_id`` once it has ``n`` finished attempts, else []."""
    rows = rows_for(client.export(), "callbacks", operation_id)
    return rows if len(rows) == n and all(r["completed_at"] for r in rows) else []


def test_callback_arrives_with_the_operation_identity(client: ToolClient) -> None:
    with CallbackReceiver() as rx:
        created = client.create("idem", "op-cb", "run-9", 4, REQ, callback_url=rx.url)
        [got] = rx.wait_for(1)
    assert got.path == "/callback"
    assert got.body == {
        "operation_id": "op-cb",
        "run_id": "run-9",
        "epoch": 4,
        "resource_id": created.resource_id,
        "tool": "idem",
        "attempt": 1,
    }
    [logged] = wait_for(
        lambda: settled_callbacks(client, "op-cb", 1),
        what="the attempt to be logged with its status",
        timeout_s=5,
    )
    assert (logged["http_status"], logged["attempt"], logged["url"]) == (200, 1, rx.url)


def test_callback_delay_ms_is_honoured(client: ToolClient) -> None:
    with CallbackReceiver() as rx:
        sent = time.time()
        client.create(
            "plain", "op-delayed", "r", 1, REQ, callback_url=rx.url, callback_delay_ms=300
        )
        [got] = rx.wait_for(1)
    assert got.at - sent >= 0.3


def test_slow_callback_fault_delays_the_callback(client: ToolClient) -> None:
    client.set_fault("queryable", "slow_callback", ms=600)
    with CallbackReceiver() as rx:
        sent = time.time()
        slow = client.create("queryable", "op-slow", "r", 1, REQ, callback_url=rx.url)
        # The act itself is not delayed: the resource exists at once.
        assert client.query("queryable", "op-slow") is not None
        fast = client.create("queryable", "op-fast", "r", 1, REQ, callback_url=rx.url)
        first, second = rx.wait_for(2)
    # The fault was used up by the first create; the second overtakes it.
    assert first.body["resource_id"] == fast.resource_id
    assert second.body["resource_id"] == slow.resource_id
    assert second.at - sent >= 0.6
    [row] = rows_for(client.export(), "requests", "op-slow")
    assert (row["fault_mode"], row["outcome"]) == ("slow_callback", "created")


def test_failed_deliveries_are_retried_and_every_attempt_logged(client: ToolClient) -> None:
    with CallbackReceiver(statuses=(500, 200)) as rx:
        client.create("idem", "op-retry", "r", 1, REQ, callback_url=rx.url)
        rx.wait_for(2)
    attempts = wait_for(
        lambda: settled_callbacks(client, "op-retry", 2),
        what="both attempts to be logged",
        timeout_s=5,
    )
    assert [(c["attempt"], c["http_status"]) for c in attempts] == [(1, 500), (2, 200)]


def test_unreachable_receiver_is_logged_as_an_error(client: ToolClient) -> None:
    with CallbackReceiver() as rx:
        url = rx.url  # a port that will be closed when the callback is due
    client.create("idem", "op-dead", "r", 1, REQ, callback_url=url)
    attempts = wait_for(
        lambda: settled_callbacks(client, "op-dead", 3),
        what="three failed attempts to be logged",
        timeout_s=5,
    )
    assert all(c["http_status"] is None and "Connection" in c["error"] for c in attempts)


def test_no_callback_without_a_new_resource(client: ToolClient) -> None:
    with CallbackReceiver() as rx:
        client.create("idem", "op-once", "r", 1, REQ, callback_url=rx.url)
        client.create("idem", "op-once", "r", 2, REQ, callback_url=rx.url)  # replay
        # A later callback that must arrive marks the point where a callback
        # for the replay would have been delivered too.
        client.create("idem", "op-marker", "r", 1, REQ, callback_url=rx.url, callback_delay_ms=200)
        received = rx.wait_for(2)
    assert [r.body["operation_id"] for r in received] == ["op-once", "op-marker"]
    assert len(rows_for(client.export(), "callbacks", "op-once")) == 1

"""Each fault mode does what it says: seen from the caller (which exception)
and from the tool's own log (export)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from harness.waiting import wait_for
from mock_tool.client import ToolClient
from mock_tool.errors import ToolBadRequest, ToolOutcomeUnknown, ToolRejected
from mock_tool.process import MockToolProcess
from tests.mock_tool.helpers import rows_for

REQ = {"k": "v"}


def only_row(client: ToolClient, operation_id: str) -> dict[str, Any]:
    rows = rows_for(client.export(), "requests", operation_id)
    assert len(rows) == 1, rows
    return rows[0]


def resource_count(client: ToolClient, operation_id: str) -> int:
    return len(rows_for(client.export(), "resources", operation_id))


def test_delay_sleeps_then_acts_normally(client: ToolClient) -> None:
    fault_id = client.set_fault("idem", "delay", ms=300)
    start = time.monotonic()
    result = client.create("idem", "op-delay", "r", 1, REQ)
    assert time.monotonic() - start >= 0.3
    assert result.http_status == 201
    row = only_row(client, "op-delay")
    assert (row["outcome"], row["fault_mode"], row["fault_id"]) == ("created", "delay", fault_id)
    assert row["completed_at"] - row["received_at"] >= 0.3


def test_drop_after_act_is_remote_success_the_caller_cannot_see(client: ToolClient) -> None:
    client.set_fault("idem", "drop_after_act")
    with pytest.raises(ToolOutcomeUnknown) as info:
        client.create("idem", "op-drop", "r", 1, REQ)
    assert info.value.http_status is None  # no answer at all
    row = only_row(client, "op-drop")
    assert (row["outcome"], row["http_status"]) == ("created_then_dropped", None)
    assert resource_count(client, "op-drop") == 1
    # The same-key retry converges on the resource that was created.
    retry = client.create("idem", "op-drop", "r", 1, REQ)
    assert retry.replayed and retry.resource_id == row["resource_id"]


def test_reject_429_does_nothing_and_is_retryable(client: ToolClient) -> None:
    client.set_fault("idem", "reject_429")
    with pytest.raises(ToolRejected) as info:
        client.create("idem", "op-429", "r", 1, REQ)
    assert info.value.retryable and info.value.http_status == 429
    row = only_row(client, "op-429")
    assert (row["outcome"], row["resource_id"]) == ("rejected_429", None)
    assert resource_count(client, "op-429") == 0
    # The fault is used up: the retry is a plain first create.
    assert not client.create("idem", "op-429", "r", 1, REQ).replayed


def test_reject_final_is_a_definite_rejection(client: ToolClient) -> None:
    client.set_fault("plain", "reject_final")
    with pytest.raises(ToolRejected) as info:
        client.create("plain", "op-422", "r", 1, REQ)
    assert not isinstance(info.value, ToolBadRequest)
    assert not info.value.retryable and info.value.http_status == 422
    row = only_row(client, "op-422")
    assert (row["outcome"], row["http_status"]) == ("rejected_final", 422)
    assert resource_count(client, "op-422") == 0


def test_error_5xx_after_act_is_ambiguous_but_the_tool_acted(client: ToolClient) -> None:
    client.set_fault("queryable", "error_5xx_after_act")
    with pytest.raises(ToolOutcomeUnknown) as info:
        client.create("queryable", "op-5xx", "r", 1, REQ)
    assert info.value.http_status == 500
    row = only_row(client, "op-5xx")
    assert (row["outcome"], row["http_status"]) == ("created_then_5xx", 500)
    # The query tells the caller the remote fact its 500 hid.
    fact = client.query("queryable", "op-5xx")
    assert fact is not None and fact.resource_id == row["resource_id"]


def test_hang_holds_the_request_until_released(client: ToolClient) -> None:
    client.set_fault("idem", "hang")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.create, "idem", "op-hang", "r", 1, REQ)
        hung = wait_for(lambda: client.faults()["hung"], what="the request to hang", timeout_s=5)
        assert hung[0]["operation_id"] == "op-hang"
        # Received and logged, but nothing done while it hangs.
        row = only_row(client, "op-hang")
        assert row["outcome"] == "pending" and resource_count(client, "op-hang") == 0
        assert not pending.done()
        assert client.release() == 1
        result = pending.result(timeout=5)
    assert result.http_status == 201
    assert only_row(client, "op-hang")["outcome"] == "created"


def test_hang_past_the_caller_timeout_still_acts_after_release(tool: MockToolProcess) -> None:
    client, impatient = tool.client(), tool.client(timeout_s=0.3)
    client.set_fault("idem", "hang")
    with pytest.raises(ToolOutcomeUnknown):
        impatient.create("idem", "op-late", "r", 1, REQ)
    wait_for(lambda: client.faults()["hung"], what="the request to still hang", timeout_s=5)
    assert client.release() == 1
    # The caller gave up; the tool acted anyway: timeout is not failure.
    row = wait_for(
        lambda: (r := only_row(client, "op-late"))["outcome"] == "created" and r,
        what="the released request to act",
        timeout_s=5,
    )
    assert resource_count(client, "op-late") == 1
    assert row["http_status"] == 201


def test_hang_ends_by_itself_after_ms(client: ToolClient) -> None:
    client.set_fault("idem", "hang", ms=250)
    start = time.monotonic()
    result = client.create("idem", "op-hang-ms", "r", 1, REQ)
    assert time.monotonic() - start >= 0.25
    assert result.http_status == 201


def test_count_star_and_clear(client: ToolClient) -> None:
    client.set_fault("*", "reject_429", count=2)
    for tool in ("plain", "idem"):
        with pytest.raises(ToolRejected):
            client.create(tool, f"op-star-{tool}", "r", 1, REQ)
    client.create("plain", "op-star-after", "r", 1, REQ)  # both firings used

    client.set_fault("plain", "reject_final", count=0)  # until cleared
    client.create("idem", "op-other-tool", "r", 1, REQ)  # other tools unaffected
    for i in range(3):
        with pytest.raises(ToolRejected):
            client.create("plain", f"op-forever-{i}", "r", 1, REQ)
    client.clear_faults()
    client.create("plain", "op-cleared", "r", 1, REQ)
    assert client.faults()["faults"] == []

    export = client.export()
    outcomes = [r["outcome"] for r in export["requests"]]
    assert outcomes == ["rejected_429"] * 2 + ["created"] * 2 + ["rejected_final"] * 3 + ["created"]
    assert [f["fired"] for f in export["faults"]] == [2, 3]

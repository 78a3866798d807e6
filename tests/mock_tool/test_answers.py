"""The answers a worker must handle beyond success: a conflict under its key
from another body, a 202 without a result, an answer after the caller's
timeout, a callback issued at a chosen moment. Each is seen from the caller
(which exception) and from the tool's own log (export)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.waiting import wait_for
from mock_tool.canonical import request_digest
from mock_tool.client import ToolClient
from mock_tool.constants import deterministic_resource_id
from mock_tool.errors import ToolConflict, ToolOutcomeUnknown, ToolRejected
from mock_tool.storage import OTHER_BODY_FIELD
from tests.mock_tool.helpers import raw_request, rows_for

REQ = {"kind": "return_label", "amount": 5}


@pytest.mark.parametrize("name", ["detid", "idem", "plain"])
def test_conflict_other_body_finds_a_resource_made_from_another_body(
    client: ToolClient, name: str
) -> None:
    client.set_fault(name, "conflict_other_body")
    with pytest.raises(ToolConflict) as info:
        client.create(name, "op-other", "r", 1, REQ)
    assert info.value.body["same_request"] is False
    export = client.export()
    [resource] = rows_for(export, "resources", "op-other")
    [row] = rows_for(export, "requests", "op-other")
    assert info.value.resource_id == resource["resource_id"] == row["resource_id"]
    assert (row["outcome"], row["http_status"]) == ("conflict_other_body", 409)
    # The resource is real and was made from another body than the caller's.
    assert resource["body_digest"] == request_digest({**REQ, OTHER_BODY_FIELD: True})
    assert row["body_digest"] == request_digest(REQ) != resource["body_digest"]
    if name == "detid":
        assert resource["resource_id"] == deterministic_resource_id("detid", "op-other")
    # What a query shows is that other body's resource: never ours.
    found = client.query(name, "op-other") if name != "plain" else None
    assert found is None or found.body_digest == resource["body_digest"]


def test_conflict_other_body_keeps_the_key_of_an_idempotent_tool(client: ToolClient) -> None:
    client.set_fault("idem", "conflict_other_body")
    with pytest.raises(ToolConflict):
        client.create("idem", "op-key", "r", 1, REQ)
    # A same-key resend of our body is a key reuse, not a second resource.
    with pytest.raises(ToolRejected) as info:
        client.create("idem", "op-key", "r", 2, REQ)
    assert info.value.http_status == 422
    assert len(rows_for(client.export(), "resources", "op-key")) == 1


def test_accept_without_result_acts_and_answers_202_without_the_resource(
    client: ToolClient,
) -> None:
    client.set_fault("queryable", "accept_without_result")
    status, body = raw_request(
        client.base_url,
        "POST",
        "/tools/queryable/operations",
        b'{"operation_id": "op-202", "run_id": "r", "epoch": 1, "request": {}}',
        {"Content-Type": "application/json"},
    )
    assert (status, body["status"]) == (202, "accepted")
    assert "resource_id" not in body
    [row] = rows_for(client.export(), "requests", "op-202")
    assert (row["outcome"], row["http_status"]) == ("created_then_accepted", 202)
    found = client.query("queryable", "op-202")
    assert found is not None and found.resource_id == row["resource_id"]


def test_the_client_takes_a_202_for_an_unknown_outcome(client: ToolClient) -> None:
    client.set_fault("queryable", "accept_without_result")
    with pytest.raises(ToolOutcomeUnknown) as info:
        client.create("queryable", "op-202c", "r", 1, REQ)
    assert info.value.http_status == 202


def test_answer_late_acts_at_once_and_answers_after_the_callers_timeout(
    client: ToolClient,
) -> None:
    client.set_fault("queryable", "answer_late", ms=1500)
    impatient = ToolClient(client.base_url, timeout_s=0.2)
    with pytest.raises(ToolOutcomeUnknown):
        impatient.create("queryable", "op-late", "r", 1, REQ)
    # The tool acted before the caller gave up.
    assert client.query("queryable", "op-late") is not None
    row = wait_for(
        lambda: next(
            (r for r in rows_for(client.export(), "requests", "op-late") if r["answered_at"]),
            None,
        ),
        what="the tool's late answer in its log",
        timeout_s=10,
    )
    assert (row["outcome"], row["http_status"]) == ("created_then_late", 201)
    # The caller gave up (above) on an answer the tool, by its own clock,
    # sent 1.5 s after acting: a lower bound no busy machine can break.
    assert row["answered_at"] - row["completed_at"] >= 1.5


def test_arrive_late_is_in_no_log_until_the_tool_sees_it(client: ToolClient) -> None:
    """A request still on the network: a query meanwhile finds nothing, not even
    a create in progress (unlike hang or delay); then it is handled normally."""
    # Long enough that a busy machine cannot make the query below come after it.
    client.set_fault("idem", "arrive_late", ms=2000)
    sent = time.time()
    with ThreadPoolExecutor(1) as pool:
        created = pool.submit(client.create, "idem", "op-arrive", "r", 1, REQ)
        time.sleep(0.3)
        assert client.query("idem", "op-arrive") is None  # no ToolOutcomeUnknown: not in progress
        assert rows_for(client.export(), "requests", "op-arrive") == []
        assert created.result(5).replayed is False
    [row] = rows_for(client.export(), "requests", "op-arrive")
    assert row["outcome"] == "created" and row["received_at"] - sent >= 2.0


def test_arrive_held_is_in_no_log_until_released(client: ToolClient) -> None:
    """Held on the network until the harness lets it arrive, however long that
    takes (a busy machine cannot make it arrive before the state it waits for):
    in no log and not in progress until released; then handled normally."""
    client.set_fault("idem", "arrive_held", ms=20_000)
    with ThreadPoolExecutor(1) as pool:
        created = pool.submit(client.create, "idem", "op-held", "r", 1, REQ)
        time.sleep(0.3)
        assert client.query("idem", "op-held") is None
        assert rows_for(client.export(), "requests", "op-held") == []
        released_at = time.time()
        assert client.release() == 1
        assert created.result(5).replayed is False
    [row] = rows_for(client.export(), "requests", "op-held")
    assert row["outcome"] == "created" and row["received_at"] >= released_at


def test_answer_late_needs_ms(client: ToolClient) -> None:
    with pytest.raises(ToolRejected):
        client.set_fault("idem", "answer_late")


def test_skip_lets_the_first_matching_requests_pass(client: ToolClient) -> None:
    client.set_fault("plain", "reject_429", skip=1)
    client.create("plain", "op-s1", "r", 1, REQ)
    with pytest.raises(ToolRejected):
        client.create("plain", "op-s2", "r", 1, REQ)
    client.create("plain", "op-s3", "r", 1, REQ)


def test_a_fault_for_one_run_fires_only_on_that_run_s_creates(client: ToolClient) -> None:
    client.set_fault("*", "reject_429", run_id="run-mine")
    client.create("plain", "op-o1", "run-other", 1, REQ)  # another run's create passes
    with pytest.raises(ToolRejected):
        client.create("idem", "op-m1", "run-mine", 1, REQ)
    client.create("idem", "op-m2", "run-mine", 1, REQ)  # fired once (count 1)
    with pytest.raises(ToolRejected):
        client.set_fault("broker", "publish_fail", run_id="run-mine")


def test_callback_now_is_the_tools_own_record_and_is_logged(client: ToolClient) -> None:
    created = client.create("plain", "op-cbnow", "run-7", 3, REQ)
    payload = client.callback_now("plain", "op-cbnow")
    assert payload == {
        "operation_id": "op-cbnow",
        "run_id": "run-7",
        "epoch": 3,
        "resource_id": created.resource_id,
        "tool": "plain",
        "attempt": 1,
    }
    [logged] = rows_for(client.export(), "callbacks", "op-cbnow")
    assert (logged["url"], logged["resource_id"]) == ("relay", created.resource_id)
    with pytest.raises(ToolRejected) as info:
        client.callback_now("plain", "op-never-made")
    assert info.value.http_status == 404


def test_arrive_held_released_with_drop_is_lost_on_the_network(client: ToolClient) -> None:
    """A held request released with drop never arrives: no answer for its
    caller (an unknown outcome), nothing in the tool's log, no resource."""
    client.set_fault("idem", "arrive_held", ms=20_000)
    with ThreadPoolExecutor(1) as pool:
        created = pool.submit(client.create, "idem", "op-lost", "r", 1, REQ)
        wait_for(
            lambda: client.faults()["hung"],
            what="the create held on the network",
            timeout_s=10,
        )
        assert client.release(drop=True) == 1
        with pytest.raises(ToolOutcomeUnknown):
            created.result(10)
    log = client.export()
    assert rows_for(log, "requests", "op-lost") == []
    assert rows_for(log, "resources", "op-lost") == []
    assert client.query("idem", "op-lost") is None


def test_release_refuses_a_drop_that_is_no_boolean(client: ToolClient) -> None:
    status, body = raw_request(
        client.base_url,
        "POST",
        "/admin/release",
        b'{"drop": "yes"}',
        {"Content-Type": "application/json"},
    )
    assert status == 400 and "drop" in str(body)

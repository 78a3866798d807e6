"""Each capability level behaves as English seed section 9 says, seen from the
caller and from the tool's own log."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.waiting import wait_for
from mock_tool.canonical import request_digest
from mock_tool.client import CreateResult, ToolClient
from mock_tool.constants import DEFAULT_TOOLS, deterministic_resource_id
from mock_tool.errors import QueryUnsupported, ToolConflict, ToolRejected
from mock_tool.process import MockToolProcess
from tests.mock_tool.helpers import rows_for

REQ = {"amount": 5, "to": "acct-1"}


def test_health_lists_the_default_tools(client: ToolClient) -> None:
    health = client.health()
    assert health["ok"] is True
    assert health["tools"] == DEFAULT_TOOLS


def test_idempotent_retry_creates_one_resource(client: ToolClient) -> None:
    first = client.create("idem", "t1/r1/s1/v1", "r1", 1, REQ)
    # A takeover retries with the same operation_id under a newer epoch.
    again = client.create("idem", "t1/r1/s1/v1", "r1", 2, REQ)
    assert (first.replayed, first.http_status) == (False, 201)
    assert (again.replayed, again.http_status) == (True, 200)
    assert again.resource_id == first.resource_id

    export = client.export()
    assert [r["resource_id"] for r in export["resources"]] == [first.resource_id]
    rows = rows_for(export, "requests", "t1/r1/s1/v1")
    assert [r["outcome"] for r in rows] == ["created", "replayed"]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert all(r["body_digest"] == request_digest(REQ) for r in rows)


def test_idempotent_concurrent_retries_create_exactly_one_resource(client: ToolClient) -> None:
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda e: client.create("idem", "op-c", "r", e, REQ), range(8)))
    assert len({r.resource_id for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    assert len(client.export()["resources"]) == 1


def test_idempotent_key_reused_with_another_request_is_refused(client: ToolClient) -> None:
    client.create("idem", "op-k", "r", 1, REQ)
    with pytest.raises(ToolRejected) as info:
        client.create("idem", "op-k", "r", 1, {**REQ, "amount": 6})
    assert info.value.http_status == 422 and not info.value.retryable
    export = client.export()
    assert len(export["resources"]) == 1
    assert [r["outcome"] for r in rows_for(export, "requests", "op-k")] == [
        "created",
        "key_reuse_rejected",
    ]


def test_idempotent_key_is_forgotten_after_the_retention_window(tmp_path: Path) -> None:
    # Seed section 9: a durable key "still cannot promise replay outside retention".
    with MockToolProcess(tmp_path / "s", idempotency_retention_s=0.3) as proc:
        client = proc.client()
        first = client.create("idem", "op-ret", "r", 1, REQ)
        # Repeats inside the window replay; poll until the window has passed.

        errors: list[Exception] = []

        def fresh_create() -> CreateResult | None:
            try:
                result = client.create("idem", "op-ret", "r", 1, REQ)
            except Exception as exc:  # wait_for would retry it: remember it to fail below
                errors.append(exc)
                raise
            return None if result.replayed else result

        later = wait_for(
            fresh_create, what="a repeat after the retention window to create anew", timeout_s=5
        )
        assert not errors, errors
        assert later.resource_id != first.resource_id
        assert len(client.export()["resources"]) == 2


def test_deterministic_id_conflict_is_detected_and_creates_nothing(client: ToolClient) -> None:
    first = client.create("detid", "op-d", "r1", 1, REQ)
    assert first.resource_id == deterministic_resource_id("detid", "op-d")
    with pytest.raises(ToolConflict) as info:
        client.create("detid", "op-d", "r1", 2, REQ)
    conflict = info.value
    assert conflict.http_status == 409
    assert conflict.resource_id == first.resource_id
    # The 409 describes the existing resource so the caller can compare intent.
    assert conflict.body["same_request"] is True
    assert conflict.body["resource"]["epoch"] == 1

    export = client.export()
    assert [r["resource_id"] for r in export["resources"]] == [first.resource_id]
    assert [r["outcome"] for r in rows_for(export, "requests", "op-d")] == ["created", "conflict"]
    fact = client.query("detid", "op-d")
    assert fact is not None and fact.resource_id == first.resource_id


def test_deterministic_id_conflict_reports_a_different_request(client: ToolClient) -> None:
    client.create("detid", "op-d2", "r1", 1, REQ)
    with pytest.raises(ToolConflict) as info:
        client.create("detid", "op-d2", "r1", 1, {"other": True})
    assert info.value.body["same_request"] is False


def test_query_returns_the_remote_fact_but_create_is_not_idempotent(client: ToolClient) -> None:
    assert client.query("queryable", "op-q") is None
    first = client.create("queryable", "op-q", "run-7", 3, REQ)
    fact = client.query("queryable", "op-q")
    assert fact is not None
    assert (fact.resource_id, fact.status, fact.run_id, fact.epoch) == (
        first.resource_id,
        "succeeded",
        "run-7",
        3,
    )
    # A blind repeat really creates a second resource, and the query shows both.
    second = client.create("queryable", "op-q", "run-7", 3, REQ)
    assert second.resource_id != first.resource_id and not second.replayed
    fact = client.query("queryable", "op-q")
    assert fact is not None
    assert fact.resource_ids == (first.resource_id, second.resource_id)
    export = client.export()
    assert len(export["resources"]) == 2
    assert [q["outcome"] for q in rows_for(export, "queries", "op-q")] == [
        "not_found",
        "found",
        "found",
    ]


def test_none_capability_retry_creates_a_second_resource(client: ToolClient) -> None:
    first = client.create("plain", "op-n", "r", 1, REQ)
    second = client.create("plain", "op-n", "r", 1, REQ)
    # The tool must not hide duplicates: two requests, two real resources.
    assert first.resource_id != second.resource_id
    assert not first.replayed and not second.replayed
    export = client.export()
    assert len(rows_for(export, "resources", "op-n")) == 2
    with pytest.raises(QueryUnsupported) as info:
        client.query("plain", "op-n")
    assert info.value.http_status == 501


def test_custom_tools_from_the_command_line(tmp_path: Path) -> None:
    tools = {"pay": "idempotent", "mail": "none"}
    with MockToolProcess(tmp_path / "s", tools=tools) as proc:
        client = proc.client()
        assert client.health()["tools"] == tools
        a = client.create("pay", "same-op", "r", 1, REQ)
        b = client.create("mail", "same-op", "r", 1, REQ)
        # Idempotency keys are per tool.
        assert a.resource_id != b.resource_id and not b.replayed

"""Bad input gets a clear 4xx saying what is wrong, and changes nothing."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mock_tool.client import ToolClient
from mock_tool.errors import ToolBadRequest
from mock_tool.process import MockToolProcess
from tests.mock_tool.helpers import raw_request

GOOD: dict[str, Any] = {"operation_id": "op", "run_id": "r", "epoch": 1, "request": {"a": 1}}
JSON = {"Content-Type": "application/json"}


def without(name: str) -> dict[str, Any]:
    return {k: v for k, v in GOOD.items() if k != name}


BAD_BODIES: list[tuple[bytes, str]] = [
    (b"{not json", "not valid JSON"),
    (b"", "empty body"),
    (b"[1, 2]", "JSON object"),
    (b'{"operation_id": NaN}', "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (json.dumps(without("operation_id")).encode(), "'operation_id'"),
    (json.dumps({**GOOD, "operation_id": ""}).encode(), "'operation_id'"),
    (json.dumps({**GOOD, "operation_id": 7}).encode(), "'operation_id'"),
    (json.dumps(without("run_id")).encode(), "'run_id'"),
    (json.dumps(without("epoch")).encode(), "'epoch'"),
    (json.dumps({**GOOD, "epoch": "1"}).encode(), "'epoch'"),
    (json.dumps({**GOOD, "epoch": True}).encode(), "'epoch'"),
    (json.dumps({**GOOD, "epoch": -1}).encode(), "'epoch'"),
    (json.dumps(without("request")).encode(), "'request'"),
    (json.dumps({**GOOD, "request": "text"}).encode(), "'request'"),
    (json.dumps({**GOOD, "callback_url": 5}).encode(), "'callback_url'"),
    (json.dumps({**GOOD, "callback_url": "ftp://x/y"}).encode(), "'callback_url'"),
    (json.dumps({**GOOD, "callback_delay_ms": -5}).encode(), "'callback_delay_ms'"),
    (json.dumps({**GOOD, "callback_delay_ms": 10**12}).encode(), "'callback_delay_ms'"),
    (json.dumps({**GOOD, "epoch": 2**64}).encode(), "'epoch'"),
    (json.dumps({**GOOD, "request": {"s": "\ud800"}}).encode(), "surrogate"),
]


def test_bad_create_bodies_get_400_and_create_nothing(
    tool: MockToolProcess, client: ToolClient
) -> None:
    for body, expected in BAD_BODIES:
        status, answer = raw_request(tool.base_url, "POST", "/tools/idem/operations", body, JSON)
        assert status == 400, (body, answer)
        assert expected in answer["error"], (body, answer)
    export = client.export()
    assert export["resources"] == []
    assert len(export["requests"]) == len(BAD_BODIES)
    assert {r["outcome"] for r in export["requests"]} == {"bad_request"}
    assert all(r["error"] for r in export["requests"])
    # The refusal did not poison the key: the first good create is a real create.
    assert not client.create("idem", "op", "r", 1, {"a": 1}).replayed


def test_unknown_tool_is_a_bad_request_naming_the_known_tools(client: ToolClient) -> None:
    with pytest.raises(ToolBadRequest) as info:
        client.create("nope", "op", "r", 1, {})
    assert "unknown tool 'nope'" in str(info.value) and "idem" in str(info.value)
    with pytest.raises(ToolBadRequest):
        client.query("nope", "op")
    export = client.export()
    assert export["resources"] == []
    assert [(r["tool"], r["outcome"]) for r in export["requests"]] == [("nope", "bad_request")]


def test_bad_fault_and_broker_requests_are_refused(
    tool: MockToolProcess, client: ToolClient
) -> None:
    for tool_name, mode, count, ms in [
        ("nope", "hang", 1, None),
        ("idem", "explode", 1, None),
        ("idem", "hang", -1, None),
        ("idem", "delay", 1, None),  # delay needs ms
        ("idem", "slow_callback", 1, None),
    ]:
        with pytest.raises(ToolBadRequest):
            client.set_fault(tool_name, mode, count=count, ms=ms)
    assert client.faults()["history"] == []

    for body in [
        {"topic": "t", "payload": {}},
        {"event_id": "e", "payload": {}},
        {"event_id": "e", "topic": "t"},
    ]:
        status, answer = raw_request(
            tool.base_url, "POST", "/broker/publish", json.dumps(body).encode(), JSON
        )
        assert status == 400 and answer["error"], answer
    status, _ = raw_request(tool.base_url, "GET", "/broker/messages?after=x")
    assert status == 400
    assert client.broker_messages() == []


def test_unknown_endpoint_and_wrong_method(tool: MockToolProcess) -> None:
    status, answer = raw_request(tool.base_url, "GET", "/nothing/here")
    assert status == 404 and "no such endpoint" in answer["error"]
    status, answer = raw_request(tool.base_url, "DELETE", "/health")
    assert status == 405 and "GET" in answer["error"]


def _run_server(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mock_tool.server", *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


def test_port_in_use_exits_2_saying_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run_server("--port", str(port), "--storage", str(tmp_path))
    assert done.returncode == 2
    assert "already in use" in done.stderr and "--port 0" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--tool", "x=magic"], "capability must be one of"),
        (["--tool", "novalue"], "NAME=CAPABILITY"),
        (["--tool", "a=none", "--tool", "a=query"], "given twice"),
        (["--idempotency-retention-s", "-1"], "retention"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_options_exit_2(tmp_path: Path, args: list[str], expected: str) -> None:
    done = _run_server("--port", "0", "--storage", str(tmp_path), *args)
    assert done.returncode == 2
    assert expected in done.stderr


def test_storage_in_use_by_another_server_exits_2(tool: MockToolProcess) -> None:
    done = _run_server("--port", "0", "--storage", str(tool.storage))
    assert done.returncode == 2
    assert f"pid {tool.pid}" in done.stderr and "--storage" in done.stderr


DEEP = 100_000


@pytest.mark.parametrize(
    "body",
    [b"[" * DEEP + b"]" * DEEP, b'{"a":' * DEEP + b"1" + b"}" * DEEP],
    ids=["deep-array", "deep-object"],
)
def test_deeply_nested_json_is_a_logged_bad_request(
    tool: MockToolProcess, client: ToolClient, body: bytes
) -> None:
    status, answer = raw_request(tool.base_url, "POST", "/tools/idem/operations", body, JSON)
    assert status == 400 and "deeper than 64 levels" in answer["error"], answer
    # Just over the bound is refused too; at the bound is parsed (then judged on its fields).
    over = {**GOOD, "request": json.loads("[" * 64 + "]" * 64)}
    status, answer = raw_request(
        tool.base_url, "POST", "/tools/idem/operations", json.dumps(over).encode(), JSON
    )
    assert status == 400 and "deeper than 64" in answer["error"], answer
    at_bound = {**GOOD, "request": {"x": json.loads("[" * 62 + "]" * 62)}}
    status, answer = raw_request(
        tool.base_url, "POST", "/tools/idem/operations", json.dumps(at_bound).encode(), JSON
    )
    assert status == 201, answer
    requests = client.export()["requests"]
    assert [(r["outcome"], r["http_status"]) for r in requests[:2]] == [("bad_request", 400)] * 2


@pytest.mark.parametrize(
    "query", ["after=9223372036854775808", "limit=99999999999999999999", "after=-1", "limit=1e3"]
)
def test_broker_integers_beyond_sqlite_are_400(tool: MockToolProcess, query: str) -> None:
    status, answer = raw_request(tool.base_url, "GET", f"/broker/messages?{query}")
    assert status == 400, answer
    assert "integer from 0 to 9223372036854775807" in answer["error"]
    status, answer = raw_request(tool.base_url, "GET", "/broker/messages?after=9223372036854775807")
    assert status == 200 and answer["messages"] == []


def test_non_finite_number_is_a_bad_request(tool: MockToolProcess) -> None:
    body = json.dumps({**GOOD, "request": {"x": 1}}).replace('"x": 1', '"x": 1e999').encode()
    status, answer = raw_request(tool.base_url, "POST", "/tools/idem/operations", body, JSON)
    assert status == 400 and "out of range" in answer["error"], answer


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"]
)
def test_wrong_content_type_is_415(
    tool: MockToolProcess, client: ToolClient, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    body = json.dumps(GOOD).encode()
    status, answer = raw_request(tool.base_url, "POST", "/tools/idem/operations", body, headers)
    assert status == 415 and "application/json" in answer["error"], answer
    assert answer["code"] == "unsupported_media_type"
    status, answer = raw_request(tool.base_url, "POST", "/broker/publish", body, headers)
    assert status == 415, answer
    export = client.export()
    assert export["resources"] == []
    assert [(r["outcome"], r["http_status"]) for r in export["requests"]] == [("bad_request", 415)]
    # A charset parameter is fine.
    status, answer = raw_request(
        tool.base_url,
        "POST",
        "/tools/idem/operations",
        body,
        {"Content-Type": "application/json; charset=utf-8"},
    )
    assert status == 201, answer

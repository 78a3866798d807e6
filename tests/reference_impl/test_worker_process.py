"""The worker program end to end: migrate / ops / run as subprocesses with a
real mock tool, checked from the database."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.evidence.metrics import samples, total
from harness.parts.postgres import Database
from mock_tool.process import MockToolProcess
from reference_impl.workflow import initial_state
from tests.reference_impl.conftest import ROLES, TENANT


@pytest.fixture
def tool(tmp_path: Path) -> Iterator[MockToolProcess]:
    with MockToolProcess(tmp_path / "tool") as proc:
        yield proc


def _env(db: Database, tool: MockToolProcess, worker: str = "A") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCECHECK_")}
    env.update(
        FENCECHECK_DSN=db.dsn(ROLES[(TENANT, "worker")]),
        FENCECHECK_ADMIN_DSN=db.admin_dsn,
        FENCECHECK_TENANT=TENANT,
        FENCECHECK_WORKER_ID=worker,
        FENCECHECK_TOOL_URL=tool.base_url,
        FENCECHECK_BROKER_URL=tool.base_url,
        FENCECHECK_LEASE_TTL_MS="3000",
        FENCECHECK_HEARTBEAT_MS="500",
        FENCECHECK_HEARTBEAT_TIMEOUT_MS="400",
        FENCECHECK_DISPATCH_TTL_MS="1000",
    )
    return env


def _worker(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reference_impl.worker", *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _ctl(env: dict[str, str]) -> dict[str, str]:
    """The same environment, logged in as the tenant's operator (control plane)."""
    worker, operator = ROLES[(TENANT, "worker")], ROLES[(TENANT, "operator")]
    return {**env, "FENCECHECK_DSN": env["FENCECHECK_DSN"].replace(worker, operator)}


def _ops(env: dict[str, str], *reqs: dict[str, Any]) -> list[dict[str, Any]]:
    lines = "".join(json.dumps({"id": i, **r}) + "\n" for i, r in enumerate(reqs))
    out = _worker(env, "ops", stdin=lines)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_migrate_ops_run_relay_consume(ref_db: Database, tool: MockToolProcess) -> None:
    env = _env(ref_db, tool)
    assert _worker(env, "migrate").returncode == 0
    replies = _ops(
        _ctl(env),
        {"op": "create_run", "args": {"task_id": "t1", "input": {"tool": "idem"}}},
        {
            "op": "create_run",
            "args": {"task_id": "t2", "input": {"tool": "plain", "extra_steps": 2}},
        },
        {"op": "bogus"},
    )
    assert [r["ok"] for r in replies] == [True, True, False]
    assert replies[2]["error"] == "Unsupported"
    run = _worker(env, "run", "--exit-when-idle")
    assert run.returncode == 0, run.stderr
    rows = ref_db.query("SELECT task_id, status, epoch FROM agent_runs ORDER BY task_id")
    assert [(r["task_id"], r["status"], r["epoch"]) for r in rows] == [
        ("t1", "succeeded", 1),
        ("t2", "succeeded", 1),
    ]
    assert len(tool.client().export()["resources"]) == 2
    relay, c1, _c2 = _ops(
        env,
        {"op": "relay", "args": {"limit": 100}},
        {"op": "consume", "args": {"consumer": "c"}},
        {"op": "consume", "args": {"consumer": "c"}},
    )
    n = len(relay["result"]["published"])
    assert n > 0 and c1["result"] == {"consumed": n, "duplicates": 0}


def test_plain_tool_lost_answer_freezes_in_doubt(
    ref_db: Database, tool: MockToolProcess, tmp_path: Path
) -> None:
    """Experiment J's end state: no automatic resend, ledger unknown, run paused."""
    env = _env(ref_db, tool)
    _ops(_ctl(env), {"op": "create_run", "args": {"task_id": "tj", "input": {"tool": "plain"}}})
    tool.client().set_fault("plain", "drop_after_act", count=5)
    snapshot = tmp_path / "w.metrics.txt"
    out = _worker({**env, "FENCECHECK_METRICS_FILE": str(snapshot)}, "run", "--once")
    assert out.returncode == 11, out.stderr
    # The metrics the worker leaves at exit say the same, across the process boundary.
    found = samples(snapshot.read_text())
    assert total(found, "runs_paused_total", status="paused_indoubt") == 1
    assert total(found, "tool_unknown_result_total") == 1
    assert total(found, "agent_runs_by_status", status="paused_indoubt") == 1
    assert total(found, "in_doubt_age_seconds") > 0
    logs = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    frozen = [line for line in logs if line.get("msg") == "freeze committed"]
    assert frozen and len(frozen[0]["trace_id"]) == 32
    assert any(line.get("msg") == "durability contract" for line in logs)
    assert ref_db.query("SELECT status FROM agent_runs")[0]["status"] == "paused_indoubt"
    assert ref_db.query("SELECT status FROM tool_operations")[0]["status"] == "unknown"
    creates = [r for r in tool.client().export()["requests"] if r.get("tool") == "plain"]
    assert len(creates) == 1


def test_schema_refused_exit_code(ref_db: Database, tool: MockToolProcess) -> None:
    """Experiment M's refusal path: an unknown checkpoint version exits 12."""
    env = _env(ref_db, tool)
    (c,) = _ops(_ctl(env), {"op": "create_run", "args": {"task_id": "tm", "input": {}}})
    run_id = c["result"]["run_id"]
    cl, sv = _ops(
        env,
        {"op": "claim", "args": {"run_id": run_id}},
        {
            "op": "save_checkpoint",
            "args": {
                "run_id": run_id,
                "epoch": 1,
                "expected_revision": 0,
                "state": {"x": 1},
                "schema_version": 99,
            },
        },
    )
    assert cl["ok"] and sv["ok"], (cl, sv)
    (rd,) = _ops(env, {"op": "read_checkpoint", "args": {"run_id": run_id}})
    assert rd["error"] == "SchemaVersionUnknown"
    ref_db.query(
        "UPDATE agent_runs SET lease_expires_at = clock_timestamp() WHERE run_id = %s", [run_id]
    )
    out = _worker(env, "run", "--run-id", run_id)
    assert out.returncode == 12, out.stderr


def test_legacy_checkpoint_sample_is_migrated(ref_db: Database, tool: MockToolProcess) -> None:
    """Experiment M's migration path through the ops interface."""
    env = _env(ref_db, tool)
    (c,) = _ops(_ctl(env), {"op": "create_run", "args": {"task_id": "tl", "input": {}}})
    run_id = c["result"]["run_id"]
    (legacy,) = _ops(env, {"op": "legacy_checkpoint"})
    sample = legacy["result"]
    _, sv, rd = _ops(
        env,
        {"op": "claim", "args": {"run_id": run_id}},
        {
            "op": "save_checkpoint",
            "args": {
                "run_id": run_id,
                "epoch": 1,
                "expected_revision": 0,
                "state": sample["state"],
                "schema_version": sample["schema_version"],
            },
        },
        {"op": "read_checkpoint", "args": {"run_id": run_id}},
    )
    assert sv["ok"] and rd["ok"], (sv, rd)
    state = rd["result"]["state"]
    for path, value in sample["expect"].items():
        node: Any = state
        for part in path.split("."):
            node = node[part]
        assert node == value, path


def test_a_plan_saved_done_on_a_live_run_is_finished_by_a_write(
    ref_db: Database, tool: MockToolProcess
) -> None:
    """A live run whose checkpoint's cursor is past its plan (a state another
    writer saved) is ended by the worker's own write, not answered succeeded
    while the run stays held (blind hunt 59's reader: both references did)."""
    env = _env(ref_db, tool)
    (c,) = _ops(_ctl(env), {"op": "create_run", "args": {"task_id": "td", "input": {}}})
    run_id = c["result"]["run_id"]
    state = initial_state({})
    state["cursor"] = len(state["plan"])
    replies = _ops(
        env,
        {"op": "claim", "args": {"run_id": run_id}},
        {
            "op": "save_checkpoint",
            "args": {"run_id": run_id, "epoch": 1, "expected_revision": 0, "state": state},
        },
        {"op": "release", "args": {"run_id": run_id, "epoch": 1}},
    )
    assert all(r["ok"] for r in replies), replies
    out = _worker(env, "run", "--run-id", run_id, "--once")
    assert out.returncode == 0, out.stderr
    row = ref_db.query("SELECT status, owner FROM agent_runs WHERE run_id = %s", (run_id,))[0]
    assert (row["status"], row["owner"]) == ("succeeded", None)


def test_refused_effect_pauses_for_a_human_and_a_supplement_plans_version_2(
    ref_db: Database, tool: MockToolProcess
) -> None:
    """A permanent error pauses for a human; the operator's supplement changes the
    request, so the effect is planned again under effect_version 2 (v1 kept)."""
    env = _env(ref_db, tool)
    (c,) = _ops(
        _ctl(env), {"op": "create_run", "args": {"task_id": "th", "input": {"tool": "plain"}}}
    )
    run_id = c["result"]["run_id"]
    tool.client().set_fault("plain", "reject_final")
    out = _worker(env, "run", "--once")
    assert out.returncode == 0, out.stderr
    assert ref_db.query("SELECT status FROM agent_runs")[0]["status"] == "paused_human"
    (d,) = _ops(
        _ctl(env),
        {
            "op": "decide",
            "args": {
                "run_id": run_id,
                "decision": "supplement",
                "supplement": {"address": "corrected"},
                "reason": "address fixed with the customer",
                "ticket": "CS-1",
            },
        },
    )
    assert d["ok"] and d["result"]["run_status"] == "queued", d
    out = _worker(env, "run", "--once")
    assert out.returncode == 0, out.stderr
    rows = ref_db.query(
        "SELECT effect_version, status, request_body->>'address' AS address FROM tool_operations"
        " ORDER BY effect_version"
    )
    assert [(r["effect_version"], r["status"], r["address"]) for r in rows] == [
        (1, "failed_final", None),
        (2, "succeeded", "corrected"),
    ]
    assert ref_db.query("SELECT status FROM agent_runs")[0]["status"] == "succeeded"
    assert len(tool.client().export()["resources"]) == 1
    audit = ref_db.query("SELECT action, ticket, operator FROM operator_actions")
    assert [(a["action"], a["ticket"]) for a in audit] == [("supplement", "CS-1")]


def test_sensitive_input_sealed_at_rest_sent_in_clear_never_logged(
    ref_db: Database, tool: MockToolProcess
) -> None:
    secret = "ct_feedfacecafebeef00112233"
    key = base64.b64encode(bytes(range(32))).decode()
    env = {**_env(ref_db, tool), "FENCECHECK_DATA_KEY": key}
    (c,) = _ops(
        _ctl(env),
        {
            "op": "create_run",
            "args": {"task_id": "ts", "input": {"tool": "idem", "customer_token": secret}},
        },
    )
    assert c["ok"], c
    out = _worker(env, "run", "--once")
    assert out.returncode == 0, out.stderr
    at_rest = ref_db.query(
        "SELECT (SELECT string_agg(input::text, '') FROM agent_runs) AS runs,"
        " (SELECT string_agg(state_json::text, '') FROM agent_checkpoints) AS checkpoints,"
        " (SELECT string_agg(request_body::text, '') FROM tool_operations) AS ledger,"
        " (SELECT string_agg(payload::text, '') FROM outbox) AS outbox"
    )[0]
    assert all(secret not in (v or "") for v in at_rest.values()), at_rest
    assert "$sealed" in at_rest["ledger"] and "$sealed" in at_rest["checkpoints"]
    (resource,) = tool.client().export()["resources"]
    assert resource["request"]["customer_token"] == secret  # the tool gets the value itself
    assert secret not in out.stdout + out.stderr
    # without the key, the sensitive field is refused, never stored in clear
    (refused,) = _ops(
        _ctl(_env(ref_db, tool)),
        {"op": "create_run", "args": {"task_id": "tk", "input": {"customer_token": secret}}},
    )
    assert refused["error"] == "SensitiveDataWithoutKey", refused

"""The operator's command line against a real database: list the paused runs with
their evidence, resolve, refuse a worker role, purge old finished tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.parts.postgres import Database
from reference_impl.operator import main
from reference_impl.runtime import Runtime
from tests.reference_impl.conftest import ROLES, TENANT, cp, new_run, take
from tests.reference_impl.test_operations import _frozen_in_doubt


def _cli(capsys: pytest.CaptureFixture[str], dsn: str, *argv: str) -> tuple[int, object]:
    code = main(["--dsn", dsn, *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def test_list_resolve_and_refusal(
    rt: Runtime, ref_db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    run, op = _frozen_in_doubt(rt)
    operator = ref_db.dsn(ROLES[(TENANT, "operator")])
    code, listed = _cli(capsys, operator, "list")
    assert code == 0 and isinstance(listed, list)
    (paused,) = listed
    assert paused["run_id"] == str(run) and paused["status"] == "paused_indoubt"
    assert paused["operations"][0]["status"] == "unknown"
    assert paused["operations"][0]["evidence"]  # the lost answer is kept as evidence
    worker = ref_db.dsn(ROLES[(TENANT, "worker")])
    args = ("resolve", str(run), op, "not_executed", "--reason", "tool console: nothing")
    assert main(["--dsn", worker, *args]) == 1  # the worker role may not decide
    code, out = _cli(capsys, operator, *args, "--ticket", "INC-1")
    assert code == 0 and isinstance(out, dict) and out["run_status"] == "queued"
    code, shown = _cli(capsys, operator, "show", str(run))
    assert isinstance(shown, dict) and [a["action"] for a in shown["actions"]] == [
        "resolve:not_executed"
    ]


def test_purge_archives_old_terminal_tasks_never_in_doubt(
    rt: Runtime, ref_db: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = new_run(rt)
    lease = take(rt, done).lease
    rt.writer.write(cp(lease, 0, transition="succeed"))
    in_doubt, _ = _frozen_in_doubt(rt)
    ref_db.query("UPDATE outbox SET published_at = clock_timestamp()")
    archive = tmp_path / "archive.jsonl"
    operator = ref_db.dsn(ROLES[(TENANT, "operator")])
    code, out = _cli(
        capsys,
        operator,
        "purge",
        "--older-than-days",
        "0",
        "--archive",
        str(archive),
        "--reason",
        "retention 0 d (test)",
    )
    assert code == 0 and isinstance(out, dict) and len(out["purged_tasks"]) == 1
    (doc,) = [json.loads(line) for line in archive.read_text().splitlines()]
    assert doc["runs"][0]["run"]["run_id"] == str(done)
    assert ref_db.query("SELECT run_id FROM agent_runs") == [{"run_id": in_doubt}]
    actions = ref_db.query("SELECT action, before FROM operator_actions WHERE action = 'purge'")
    assert actions == [{"action": "purge", "before": {"tasks": 1, "older_than_ms": 0}}]

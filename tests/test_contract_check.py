"""`fencecheck contract` and `fencecheck run --worker-cmd` against the reference
worker and small hostile workers (tests/hostile/): each gets the verdict, the
exit code and the message the contract promises (docs/worker-contract.md,
section 12)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.harness.helpers import fencecheck_cli as fencecheck

pytestmark = pytest.mark.slow


def hostile(name: str) -> str:
    return f"{sys.executable} -m tests.hostile.{name}"


@pytest.mark.timeout(300)
def test_reference_worker_is_conformant(tmp_path: Path) -> None:
    done = fencecheck("contract", "--quiet", "--report-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CONFORMANT: no gap found" in done.stdout
    assert '"conformant": true' in (tmp_path / "contract.json").read_text()


@pytest.mark.timeout(300)
def test_a_missing_reply_field_stops_the_run_with_the_contract_report(tmp_path: Path) -> None:
    done = fencecheck(
        "run",
        "A",
        "--quiet",
        "--worker-cmd",
        hostile("missing_reply_field"),
        "--report-dir",
        str(tmp_path),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "[§5] reply of save_checkpoint" in done.stdout
    assert "'event_id' is a required property" in done.stdout
    assert "the matrix was not run" in done.stdout
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "contract.txt").exists()
    assert not (run_dir / "archives").exists()


@pytest.mark.timeout(300)
def test_a_failing_migrate_is_the_gap_of_section_1(tmp_path: Path) -> None:
    done = fencecheck(
        "contract",
        "--quiet",
        "--worker-cmd",
        hostile("failing_migrate"),
        "--report-dir",
        str(tmp_path),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert (
        "[§1] migrate: expected exit 0 on a fresh database; found exit 3: migrate: giving up"
        in (done.stdout)
    )
    assert "simulated" in (tmp_path / "logs" / "migrate.log").read_text()


@pytest.mark.timeout(300)
def test_a_failing_migrate_ends_the_run_with_exit_2_and_one_paragraph(tmp_path: Path) -> None:
    done = fencecheck(
        "run",
        "--quiet",
        "--skip-contract",
        "--worker-cmd",
        hostile("failing_migrate"),
        "--report-dir",
        str(tmp_path),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "Traceback" not in out
    paragraph = next(line for line in out.splitlines() if "failed with exit code 3" in line)
    assert "tests.hostile.failing_migrate migrate" in paragraph
    assert 'relation "agent_runs" already exists (simulated) | migrate: giving up' in paragraph
    (run_dir,) = tmp_path.iterdir()
    kept = (run_dir / "logs" / "run" / "migrate.log").read_text()  # its one copy
    assert "applying 001_roles.sql" in kept and "giving up" in kept
    assert "failed with exit code 3" in (run_dir / "summary.md").read_text()


@pytest.mark.timeout(300)
def test_policies_reading_a_setting_are_named(tmp_path: Path) -> None:
    done = fencecheck("contract", "--quiet", "--worker-cmd", hostile("tenant_from_setting"))
    assert done.returncode == 1, done.stdout + done.stderr
    for table in ("agent_runs", "agent_checkpoints", "tool_operations", "outbox"):
        assert f"[§7.4] policies of public.{table}" in done.stdout


@pytest.mark.timeout(300)
def test_what_a_system_declares_absent_is_not_applicable(tmp_path: Path) -> None:
    """B, K and R judge the queue layer of a system without a fencing token;
    C needs what it declares absent: not applicable, named, in every report."""
    done = fencecheck(
        "run", "B", "C", "K", "R", "--quiet", "--skip-contract",
        "--worker-cmd", hostile("declares_queue_only"), "--report-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not applicable C" in done.stdout.splitlines()[-1]
    (run_dir,) = (p for p in tmp_path.iterdir() if not p.is_symlink())
    results = {
        r["experiment"]: r for r in json.loads((run_dir / "results.json").read_text())["results"]
    }
    assert {k: r["verdict"] for k, r in results.items()} == {
        "B": "pass", "C": "not_applicable", "K": "pass", "R": "pass",
    }  # fmt: skip
    assert "declares no checkpoints, revision_check" in results["C"]["reason"]
    assert "<skipped" in (run_dir / "junit.xml").read_text()
    gated = fencecheck(
        "merge", str(run_dir), "--into", str(tmp_path / "m"), "--fail-on", "not_applicable"
    )
    assert gated.returncode == 1, gated.stdout + gated.stderr
    assert "not applicable C" in gated.stdout


@pytest.mark.timeout(120)
def test_an_invalid_mapping_is_refused_naming_the_field(tmp_path: Path) -> None:
    done = fencecheck(
        "run",
        "B",
        "--quiet",
        "--worker-cmd",
        hostile("invalid_mapping"),
        "--report-dir",
        str(tmp_path),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "capabilities.renewal: 'per_job' is not one of" in done.stderr
    contract = fencecheck("contract", "--quiet", "--worker-cmd", hostile("invalid_mapping"))
    assert contract.returncode == 1 and "[§14] the mapping" in contract.stdout

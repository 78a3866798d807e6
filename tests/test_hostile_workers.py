"""Hostile workers get the verdict the contract promises (issue: no pass by
accident, no unknown that hides a fail).

Each worker (tests/hostile/) is the reference worker with one behaviour
changed; each runs the experiment that must judge it, exactly as
`fencecheck run --worker-cmd` does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import scenarios
from harness.engine.environment import Settings, SharedServices
from harness.engine.runner import jobs_for, run_job
from harness.evidence.summary import ExperimentResult
from harness.verdict import Verdict

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def run_with(worker: str, experiment: str, tmp_path: Path) -> Iterator[ExperimentResult]:
    settings = Settings(worker_cmd=(sys.executable, "-m", f"tests.hostile.{worker}"))
    with SharedServices(settings) as shared:
        for job in jobs_for(scenarios.select([experiment]), repeat=1):
            yield run_job(shared, job, report_dir=tmp_path, seed=1)


@pytest.mark.timeout(240)
def test_redoing_steps_under_another_key_fails_i(tmp_path: Path) -> None:
    (result,) = run_with("redo_steps", "I", tmp_path)
    assert result.verdict is Verdict.FAIL, result.reason
    assert any("no step redone" in c for c in result.failed_checks), result.failed_checks


@pytest.mark.timeout(240)
def test_resending_reconcile_fails_f_unknown(tmp_path: Path) -> None:
    results = {r.variant: r for r in run_with("resending_reconcile", "F", tmp_path)}
    unknown = results["unknown"]
    assert unknown.verdict is Verdict.FAIL, unknown.reason
    assert "effect.no_resend_without_idempotency" in unknown.reason


@pytest.mark.timeout(240)
def test_surrogate_checkpoint_key_is_no_harness_error_in_m(tmp_path: Path) -> None:
    for result in run_with("surrogate_checkpoint_key", "M", tmp_path):
        assert result.verdict is Verdict.PASS, (result.variant, result.reason)


@pytest.mark.timeout(240)
def test_zero_checkpoints_do_not_pass_a(tmp_path: Path) -> None:
    (result,) = run_with("zero_checkpoints", "A", tmp_path)
    assert result.verdict is Verdict.FAIL, result.reason
    assert any("committed together" in c for c in result.failed_checks), result.failed_checks


@pytest.mark.timeout(240)
def test_a_worker_that_never_exits_fails_its_bound(tmp_path: Path) -> None:
    (result,) = run_with("loops_forever", "I", tmp_path)
    assert result.verdict is Verdict.FAIL, result.reason
    assert any("kept its bounds" in c for c in result.failed_checks), result.failed_checks
    assert "did not exit within" in " ".join(result.failed_checks)

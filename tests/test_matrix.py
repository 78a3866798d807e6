"""The acceptance matrix as a pytest suite: one test per experiment (and variant).

Each test runs the experiment against real processes exactly as
`fencecheck run` does and passes only on verdict *pass*; its evidence archive
is written under reports/pytest-<time>/ (kept as a CI artifact). Set
FENCECHECK_WORKER_CMD to put another worker under test.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import scenarios
from harness.engine.environment import DEFAULT_WORKER_CMD, Settings, SharedServices
from harness.engine.runner import Job, jobs_for, run_job
from harness.verdict import Verdict

pytestmark = pytest.mark.matrix

REPORTS = Path(__file__).resolve().parent.parent / "reports"
JOBS = jobs_for(scenarios.all_modules(), repeat=1)


@pytest.fixture(scope="session")
def matrix_services() -> Iterator[SharedServices]:
    cmd = os.environ.get("FENCECHECK_WORKER_CMD")
    backend = os.environ.get("FENCECHECK_BACKEND", "local")  # containers: make test-containers
    settings = Settings(
        worker_cmd=tuple(shlex.split(cmd)) if cmd else DEFAULT_WORKER_CMD, backend=backend
    )
    with SharedServices(settings) as shared:
        yield shared


@pytest.fixture(scope="session")
def matrix_report_dir() -> Path:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = REPORTS / f"pytest-{time.strftime('%Y%m%dT%H%M%S')}-{worker}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("job", JOBS, ids=[j.label for j in JOBS])
def test_experiment(job: Job, matrix_services: SharedServices, matrix_report_dir: Path) -> None:
    result = run_job(matrix_services, job, report_dir=matrix_report_dir, seed=20261129)
    detail = "\n".join(result.failed_checks) or result.reason
    assert result.verdict is Verdict.PASS, (
        f"{job.label} {result.verdict.value}: {result.reason}\n{detail}\n"
        f"evidence: {result.archive_path}"
    )

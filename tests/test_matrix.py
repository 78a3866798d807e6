"""The acceptance matrix as a pytest suite: one test per experiment (and variant).

The experiments selected in this session run against real processes exactly
as `fencecheck run` runs them: all at once, ``FENCECHECK_MATRIX_JOBS`` (4) at
a time, on the first test that needs a result (they mostly wait on leases, as
`fencecheck run --jobs` does); each test then passes only on its own verdict
*pass*. Evidence archives are written under reports/pytest-<time>/ (kept as a
CI artifact). Set FENCECHECK_WORKER_CMD to put another worker under test.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import scenarios
from harness.cli.run import RETRY_UNKNOWN
from harness.engine.environment import DEFAULT_WORKER_CMD, Settings, SharedServices
from harness.engine.runner import Job, jobs_for, run_jobs
from harness.evidence.summary import ExperimentResult
from harness.verdict import Verdict

# The whole matrix runs in the first test's setup (a session fixture), so the
# suite's 300 s per test would bound all of it: on containers beside the main
# suite it takes about that long (the CI of 78e89bc timed out there, every
# experiment fine). Each experiment's waits have bounds of their own; this
# only keeps a bound on the whole.
pytestmark = [pytest.mark.matrix, pytest.mark.timeout(1800)]

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
    # The pid too: `make test` runs this file's matrix for two workers at once,
    # and two sessions that started in one second shared a folder (and their
    # workers' histories) before.
    path = REPORTS / f"pytest-{time.strftime('%Y%m%dT%H%M%S')}-{worker}-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=False)
    return path


@pytest.fixture(scope="session")
def matrix_results(
    request: pytest.FixtureRequest, matrix_services: SharedServices, matrix_report_dir: Path
) -> dict[str, ExperimentResult]:
    """The verdict of every experiment this session selected, run side by side."""
    selected: set[str] = set()
    for item in request.session.items:
        job = getattr(getattr(item, "callspec", None), "params", {}).get("job")
        if isinstance(job, Job):
            selected.add(job.label)
    jobs = [j for j in JOBS if j.label in selected]
    parallel = int(os.environ.get("FENCECHECK_MATRIX_JOBS", "4"))
    # As `fencecheck run` does: an unknown (it proved nothing) gets one more
    # attempt, its evidence kept; a fail never does.
    results = run_jobs(
        matrix_services,
        jobs,
        report_dir=matrix_report_dir,
        seed=20261129,
        parallel=parallel,
        retry_unknown=RETRY_UNKNOWN,
    )
    return {job.label: result for job, result in zip(jobs, results, strict=True)}


@pytest.mark.parametrize("job", JOBS, ids=[j.label for j in JOBS])
def test_experiment(job: Job, matrix_results: dict[str, ExperimentResult]) -> None:
    result = matrix_results[job.label]
    if result.verdict is Verdict.NOT_APPLICABLE:
        # The worker declares it lacks what the run needs (its mapping): no
        # verdict either way, shown as skipped with the reason.
        pytest.skip(f"{job.label} not applicable: {result.reason}")
    detail = "\n".join(result.failed_checks) or result.reason
    assert result.verdict is Verdict.PASS, (
        f"{job.label} {result.verdict.value}: {result.reason}\n{detail}\n"
        f"evidence: {result.archive_path}"
    )

"""Every random choice of an experiment comes from its job's own generator,
seeded by the run's seed and the job's label."""

from __future__ import annotations

import scenarios
from harness.engine.runner import Job, job_rng, jobs_for


def test_each_job_draws_from_its_own_generator() -> None:
    jobs: list[Job] = jobs_for(scenarios.select(["A"]), repeat=2)
    draws = [job_rng(7, j).random() for j in jobs]
    assert draws[0] != draws[1]  # a repetition is another schedule
    assert draws == [job_rng(7, j).random() for j in jobs]
    assert job_rng(8, jobs[0]).random() != draws[0]
    assert job_rng(None, jobs[0]).random() != job_rng(None, jobs[0]).random()

"""The longest expected experiment run starts first: measured here, or estimated."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import scenarios
from harness.engine import job_order
from harness.engine.runner import jobs_for
from harness.engine.shards import job_cost
from harness.evidence.summary import ExperimentResult
from harness.verdict import Verdict

JOBS = jobs_for(scenarios.all_modules(), repeat=1)


def _result(label: str, duration_s: float) -> ExperimentResult:
    job = next(j for j in JOBS if j.label == label)
    return ExperimentResult(
        experiment_id=job.spec.id,
        title=job.spec.title,
        variant=job.variant,
        repeat_index=0,
        verdict=Verdict.PASS,
        reason="",
        duration_s=duration_s,
        natural_wait_s=0.0,
        archive_path=None,
        invariant="",
    )


def test_without_measurements_the_static_estimate_orders_ties_in_job_order() -> None:
    order = job_order.longest_first(JOBS, {})
    costs = [job_cost(JOBS[i]) for i in order]
    assert sorted(order) == list(range(len(JOBS)))
    assert costs == sorted(costs, reverse=True)
    for a, b in itertools.pairwise(order):
        if job_cost(JOBS[a]) == job_cost(JOBS[b]):
            assert a < b


def test_measured_durations_come_back_and_put_the_longest_first(tmp_path: Path) -> None:
    assert job_order.measured(tmp_path) == {}
    last = JOBS[-1].label
    job_order.remember([_result(last, 99.0), _result(JOBS[0].label, 0.0)], tmp_path)
    known = job_order.measured(tmp_path)
    assert known == {last: 99.0}  # a run that never ran (0 s) says nothing
    assert job_order.longest_first(JOBS, known)[0] == len(JOBS) - 1
    # A later run keeps the others' figures and updates its own.
    job_order.remember([_result(JOBS[1].label, 1.5)], tmp_path)
    assert job_order.measured(tmp_path) == {last: 99.0, JOBS[1].label: 1.5}


def test_an_unreadable_file_falls_back_to_the_estimate(tmp_path: Path) -> None:
    path = job_order._path(tmp_path)
    path.parent.mkdir(parents=True)
    for text in ("{not json", json.dumps([1, 2]), json.dumps({"A": "slow", "B": True, "C": -1})):
        path.write_text(text)
        assert job_order.measured(tmp_path) == {}
    job_order.remember([_result(JOBS[0].label, 2.0)], tmp_path)  # and is replaced whole
    assert job_order.measured(tmp_path) == {JOBS[0].label: 2.0}

"""The longest expected experiment run starts first: measured, or estimated."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import yaml

import scenarios
from harness.engine import job_order
from harness.engine.runner import jobs_for
from harness.engine.shards import job_cost

JOBS = jobs_for(scenarios.all_modules(), repeat=1)
LABELS = {j.label for j in JOBS}


def test_without_measurements_the_static_estimate_orders_ties_in_job_order() -> None:
    order = job_order.longest_first(JOBS, {})
    costs = [job_cost(JOBS[i]) for i in order]
    assert sorted(order) == list(range(len(JOBS)))
    assert costs == sorted(costs, reverse=True)
    for a, b in itertools.pairwise(order):
        if job_cost(JOBS[a]) == job_cost(JOBS[b]):
            assert a < b


def test_a_measured_duration_wins_over_the_estimate() -> None:
    last = JOBS[-1].label
    assert job_order.longest_first(JOBS, {last: 99.0})[0] == len(JOBS) - 1


def test_the_kept_durations_name_experiment_runs_of_the_matrix() -> None:
    kept = job_order.expected_durations()
    assert kept, f"{job_order.EXPECTED} is missing or unreadable"
    assert set(kept) <= LABELS, f"labels no experiment has: {sorted(set(kept) - LABELS)}"
    # A new variant without a measured length is ordered by the static estimate,
    # which can start a long run last: measure it (module docstring says how).
    assert set(kept) >= LABELS, f"runs without a kept duration: {sorted(LABELS - set(kept))}"


FIXTURE = Path(__file__).parents[1] / "report" / "fixtures" / "run-pass" / "archives" / "B.yaml"


def _archive(run: Path, label: str, verdict: str, duration_s: float) -> None:
    # A real archive (the schema is checked on reading), its verdict and length set.
    data = yaml.safe_load(FIXTURE.read_text())
    data.update(pass_or_fail=verdict, duration_s=duration_s)
    (run / "archives").mkdir(parents=True, exist_ok=True)
    (run / "archives" / f"{label}.yaml").write_text(yaml.safe_dump(data))


def test_measured_is_the_median_of_passing_runs(tmp_path: Path) -> None:
    runs = [tmp_path / f"run{i}" for i in range(3)]
    for run, seconds in zip(runs, (1.0, 3.0, 2.0), strict=True):
        _archive(run, "A", "pass", seconds)
    _archive(runs[0], "B", "fail", 50.0)  # a failing run's length is no norm
    (runs[1] / "archives" / "C.yaml").write_text("not: [an archive")  # unreadable: unknown
    assert job_order.measured(runs) == {"A": 2.0}


def test_an_unreadable_file_falls_back_to_the_estimate(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    assert job_order.expected_durations(path) == {}
    for text in ("{not json", json.dumps([1, 2]), json.dumps({"A": "slow", "B": True, "C": -1})):
        path.write_text(text)
        job_order.expected_durations.cache_clear()
        assert job_order.expected_durations(path) == {}
    job_order.expected_durations.cache_clear()


def test_a_directory_without_archives_is_refused(tmp_path: Path) -> None:
    assert job_order.main([str(tmp_path)]) == 2


def test_shards_are_balanced_by_the_kept_durations() -> None:
    """A shard plan weighs each run by its measured duration where the code
    keeps one: four parts of the matrix end within a few seconds of each
    other by those durations (the static estimate left 6.7 s between them)."""
    from harness.evidence.shard_record import job_items

    jobs = jobs_for(scenarios.all_modules(), 1)
    known = job_order.expected_durations()
    items = job_items(jobs, 4)
    assert all(
        item.cost_s == known.get(item.label, job_cost(job))
        for item, job in zip(items, jobs, strict=True)
    )
    loads = [sum(i.cost_s for i in items if i.shard == s) for s in range(1, 5)]
    assert max(loads) - min(loads) <= 0.1 * max(loads), loads

"""Shards: the split of a job list is complete, disjoint, balanced and the same everywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import scenarios
from harness.cli import main as cli_main
from harness.engine.runner import jobs_for
from harness.engine.shards import Shard, ShardError, assign, job_cost, job_key, pick

JOBS = jobs_for(scenarios.all_modules(), repeat=1)


def test_the_job_list_is_the_matrix() -> None:
    # The split tests below are about this list: every experiment variant once.
    labels = [j.label for j in JOBS]
    assert len(labels) == len(set(labels)) > 20
    assert {j.module.SPEC.id for j in JOBS} == {m.SPEC.id for m in scenarios.all_modules()}


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_parts_cover_every_job_once(count: int) -> None:
    parts = [pick(JOBS, Shard(k, count), key=job_key, cost=job_cost) for k in range(1, count + 1)]
    labels = [j.label for part in parts for j in part]
    assert sorted(labels) == sorted(j.label for j in JOBS)
    assert len(labels) == len(set(labels)), "a job is in two parts"
    assert all(parts), "a part is empty"
    # Within a part, jobs keep the matrix order.
    order = {j.label: i for i, j in enumerate(JOBS)}
    for part in parts:
        assert [order[j.label] for j in part] == sorted(order[j.label] for j in part)


@pytest.mark.parametrize("count", [2, 3, 5])
def test_parts_are_balanced_by_expected_cost(count: int) -> None:
    loads = [
        sum(job_cost(j) for j in pick(JOBS, Shard(k, count), key=job_key, cost=job_cost))
        for k in range(1, count + 1)
    ]
    # Longest-first greedy: the heaviest part exceeds the lightest by at most one job.
    assert max(loads) - min(loads) <= max(job_cost(j) for j in JOBS)


def test_split_depends_on_the_list_not_on_the_process() -> None:
    """Another interpreter with another hash seed computes the same split."""
    here = assign(JOBS, 4, key=job_key, cost=job_cost)
    code = (
        "import scenarios\n"
        "from harness.engine.runner import jobs_for\n"
        "from harness.engine.shards import assign, job_cost, job_key\n"
        "print(assign(jobs_for(scenarios.all_modules(), 1), 4, key=job_key, cost=job_cost))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
        timeout=60,
    ).stdout
    assert out.strip() == str(here)


def test_shard_parse_and_errors() -> None:
    assert Shard.parse("2/4") == Shard(2, 4)
    assert str(Shard.parse(" 1 / 1 ")) == "1/1"
    for bad in ("0/4", "5/4", "2", "a/b", "1/0", "-1/3"):
        with pytest.raises(ShardError, match="--shard"):
            Shard.parse(bad)


def test_more_parts_than_items_is_refused() -> None:
    with pytest.raises(ShardError, match="use at most 3 shards"):
        assign(["a", "b", "c"], 4, key=str, cost=lambda _i: 1.0)


def test_items_named_twice_are_refused() -> None:
    with pytest.raises(ShardError, match="named twice: a"):
        assign(["a", "b", "a"], 2, key=str, cost=lambda _i: 1.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--shard", "2/4"], "--shard 2/4 needs --seed"),
        (["run", "--shard", "5/4", "--seed", "1"], "between 1 and the number of parts"),
        (["run", "A", "B", "--shard", "1/3", "--seed", "1"], "use at most 2 shards"),
        (["run", "--shard", "two", "--seed", "1"], "is not K/N"),
    ],
)
def test_bad_shard_options_are_usage_errors(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main([*argv, "--report-dir", str(tmp_path)])
    assert code == 64
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "a refused run leaves no run directory"

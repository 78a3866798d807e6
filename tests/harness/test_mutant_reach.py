"""A generated mutant runs only the experiments that can reach its code
(harness/mutation/reach.py), conservatively."""

from __future__ import annotations

import dataclasses

import scenarios
from harness.engine.runner import jobs_for
from harness.evidence.summary import ExperimentResult
from harness.mutation.reach import Reach
from harness.mutation.sites import AutoMutant
from harness.verdict import Verdict

JOBS = jobs_for(scenarios.select(["A", "B", "H"]), 1)


def _result(
    experiment: str, variant: str | None, called: dict[str, int] | None
) -> ExperimentResult:
    r = ExperimentResult(experiment, "t", variant, 0, Verdict.PASS, "", 1.0, 0.0, None, "")
    return dataclasses.replace(r, functions_called=called)


def _mutant(language: str, scope: str) -> AutoMutant:
    return AutoMutant(
        id=f"x:{scope}:op:0", language=language, path="x", line=1, scope=scope,  # type: ignore[arg-type]
        operator="op", original="a", replacement="b", edits=(),
    )  # fmt: skip


REACH = Reach.of(
    [
        _result("A", None, {"fencecheck.save": 3, "fencecheck.renew": 0}),
        _result("B", None, {"fencecheck.renew": 2}),
        _result("H", "async", None),  # failed over: not known
    ],
    ["fencecheck.save", "fencecheck.renew", "fencecheck.purge"],
)


def test_a_sql_mutant_runs_what_ran_its_function_and_what_is_not_known() -> None:
    labels = [j.label for j in REACH.jobs_for(_mutant("sql", "fencecheck.renew"), JOBS)]
    assert "B" in labels and "A" not in labels  # A counted 0 calls of it
    assert {"H-async", "H-sync", "H-sync_cancelled_wait"} <= set(labels)  # no count: run


def test_a_function_no_experiment_ran_is_reached_by_the_unknown_ones_only() -> None:
    labels = [j.label for j in REACH.jobs_for(_mutant("sql", "fencecheck.purge"), JOBS)]
    assert labels and all(label.startswith("H") for label in labels)
    without_h = Reach({k: v for k, v in REACH.ran.items() if v is not None}, REACH.functions)
    jobs = [j for j in JOBS if not j.label.startswith("H")]
    assert without_h.jobs_for(_mutant("sql", "fencecheck.purge"), jobs) == []


def test_python_mutants_and_top_level_ddl_run_everything() -> None:
    assert REACH.jobs_for(_mutant("python", "Ledger.claim"), JOBS) == JOBS
    assert REACH.jobs_for(_mutant("sql", "(grants)"), JOBS) == JOBS

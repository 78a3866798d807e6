"""A generated mutant runs only the experiments that can reach its code
(harness/mutation/reach.py), conservatively."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import psycopg
import pytest

import scenarios
from harness.cli.common import REPO_ROOT
from harness.engine.runner import jobs_for
from harness.evidence.summary import ExperimentResult
from harness.mutation.error_context import functions_in_error_context
from harness.mutation.reach import Reach, python_functions, sql_callees
from harness.mutation.sites import AutoMutant
from harness.mutation.traced_worker import CALLS_FILE_ENV, TRACED_WORKER_CMD
from harness.parts.postgres import Database
from harness.verdict import Verdict

JOBS = jobs_for(scenarios.select(["A", "B", "H"]), 1)


def _result(
    experiment: str,
    variant: str | None,
    called: dict[str, int] | None,
    python: list[str] | None = None,
) -> ExperimentResult:
    r = ExperimentResult(experiment, "t", variant, 0, Verdict.PASS, "", 1.0, 0.0, None, "")
    return dataclasses.replace(r, functions_called=called, python_calls=python)


def _mutant(language: str, scope: str, path: str = "x") -> AutoMutant:
    return AutoMutant(
        id=f"x:{scope}:op:0", language=language, path=path, line=1, scope=scope,  # type: ignore[arg-type]
        operator="op", original="a", replacement="b", edits=(),
    )  # fmt: skip


PY = "reference_impl/ledger.py"
REACH = Reach.of(
    [
        _result("A", None, {"fencecheck.save": 3, "fencecheck.renew": 0}, [f"{PY}:Ledger.claim"]),
        _result("B", None, {"fencecheck.renew": 2}, [f"{PY}:Ledger.send", f"{PY}:setup"]),
        _result("H", "async", None, None),  # failed over, not traced: not known
    ],
    [
        "fencecheck.save", "fencecheck.renew", "fencecheck.purge",
        f"{PY}:Ledger.claim", f"{PY}:Ledger.send", f"{PY}:Ledger.unused", f"{PY}:setup",
    ],
    everywhere=[f"{PY}:setup"],
)  # fmt: skip


def test_a_sql_mutant_runs_what_ran_its_function_and_what_is_not_known() -> None:
    labels = [j.label for j in REACH.jobs_for(_mutant("sql", "fencecheck.renew"), JOBS)]
    assert "B" in labels and "A" not in labels  # A counted 0 calls of it
    assert {"H-async", "H-sync", "H-sync_cancelled_wait"} <= set(labels)  # no count: run


def test_a_function_no_experiment_ran_is_reached_by_the_unknown_ones_only() -> None:
    labels = [j.label for j in REACH.jobs_for(_mutant("sql", "fencecheck.purge"), JOBS)]
    assert labels and all(label.startswith("H") for label in labels)
    jobs = [j for j in JOBS if not j.label.startswith("H")]
    assert REACH.jobs_for(_mutant("sql", "fencecheck.purge"), jobs) == []


def test_a_python_mutant_runs_what_ran_its_function() -> None:
    labels = [j.label for j in REACH.jobs_for(_mutant("python", "Ledger.claim", PY), JOBS)]
    assert "A" in labels and "B" not in labels and "H-async" in labels
    jobs = [j for j in JOBS if not j.label.startswith("H")]
    assert REACH.jobs_for(_mutant("python", "Ledger.unused", PY), jobs) == []


def test_what_migrate_ran_module_code_and_top_level_ddl_run_everything() -> None:
    assert REACH.jobs_for(_mutant("python", "setup", PY), JOBS) == JOBS  # migrate ran it
    assert REACH.jobs_for(_mutant("python", "<module>", PY), JOBS) == JOBS
    assert REACH.jobs_for(_mutant("python", "Ledger.claim", "other.py"), JOBS) == JOBS
    assert REACH.jobs_for(_mutant("sql", "(grants)"), JOBS) == JOBS


def test_the_traced_worker_records_what_ran_also_at_import(tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    env = {**os.environ, CALLS_FILE_ENV: str(calls)}
    done = subprocess.run(
        [*TRACED_WORKER_CMD, "write-paths"], env=env, capture_output=True, timeout=60, check=True
    )
    assert json.loads(done.stdout)  # the worker itself ran as usual
    ran = set(calls.read_text().split())
    assert "reference_impl/worker.py:main" in ran
    assert "reference_impl/worker.py:parser" in ran
    assert not any("harness" in line for line in ran)  # only the implementation's own
    # Names as the reach looks them up (the rest are module and class bodies).
    known = python_functions(REPO_ROOT, sorted({line.split(":")[0] for line in ran}))
    assert {"reference_impl/worker.py:main", "reference_impl/worker.py:parser"} <= known


def test_a_function_whose_calls_all_raised_is_reached_through_its_callers() -> None:
    # The server counts a call when it returns: a freeze refused in every call
    # is missing from the count, though the write that called it ran.
    calls = sql_callees(
        {
            "fencecheck.write": "BEGIN PERFORM fencecheck._freeze (p_run, p_effect); END",
            "fencecheck._freeze": "BEGIN RAISE EXCEPTION 'converged'; END",
            "fencecheck.renew": "BEGIN RETURN fencecheck._ms(p_ttl); END",
            "fencecheck._ms": "BEGIN RETURN p_ms * interval '1 ms'; END",
        }
    )
    assert calls == {
        "fencecheck.write": frozenset({"fencecheck._freeze"}),
        "fencecheck.renew": frozenset({"fencecheck._ms"}),
    }
    reach = Reach.of(
        [_result("A", None, {"fencecheck.write": 2}), _result("B", None, {"fencecheck.renew": 1})],
        ["fencecheck.write", "fencecheck._freeze", "fencecheck.renew", "fencecheck._ms"],
        sql_calls=calls,
    )
    jobs = [j for j in JOBS if not j.label.startswith("H")]
    assert [j.label for j in reach.jobs_for(_mutant("sql", "fencecheck._freeze"), jobs)] == ["A"]
    assert [j.label for j in reach.jobs_for(_mutant("sql", "fencecheck._ms"), jobs)] == ["B"]


def test_a_function_called_directly_whose_calls_all_raised_is_named_by_the_server_log(
    fresh_db: Database,
) -> None:
    # The server's own log, not a sample of its format: a function called at
    # top level that raises is in no count, but in the context of its error.
    fresh_db.query("CREATE SCHEMA reach_t")
    fresh_db.query(
        "CREATE FUNCTION reach_t.inner_refuses() RETURNS void LANGUAGE plpgsql "
        "AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$"
    )
    fresh_db.query(
        "CREATE FUNCTION reach_t.outer_calls() RETURNS void LANGUAGE plpgsql "
        "AS $$ BEGIN PERFORM reach_t.inner_refuses(); END $$"
    )
    fresh_db.query(
        "CREATE FUNCTION reach_t.sql_refuses() RETURNS int LANGUAGE sql AS $$ SELECT 1 / 0 $$"
    )
    for call in ("reach_t.outer_calls()", "reach_t.sql_refuses()"):
        with pytest.raises(psycopg.Error):
            fresh_db.query(f"SELECT {call}")
    log = fresh_db.cluster.log_path.read_text(errors="replace").splitlines()
    named = functions_in_error_context(log, fresh_db.name)
    assert {"reach_t.inner_refuses", "reach_t.outer_calls"} <= named
    assert "sql_refuses" in named or "reach_t.sql_refuses" in named
    assert functions_in_error_context(log, fresh_db.name + "_other") == frozenset()
    functions = ["reach_t.inner_refuses", "reach_t.outer_calls", "reach_t.sql_refuses", "x.other"]
    reach = Reach.of(
        [
            dataclasses.replace(_result("A", None, {}), functions_raised=sorted(named)),
            _result("B", None, {}),
        ],
        functions,
    )
    jobs = [j for j in JOBS if not j.label.startswith("H")]
    for scope in ("reach_t.inner_refuses", "reach_t.outer_calls", "reach_t.sql_refuses"):
        assert [j.label for j in reach.jobs_for(_mutant("sql", scope), jobs)] == ["A"]
    assert reach.jobs_for(_mutant("sql", "x.other"), jobs) == []

"""The matrix can fail: every mutant of every worker under test must be caught.

Runs `fencecheck mutants` (all mutants, each against its expected catchers,
then the rest of the matrix if needed) for the Python reference worker and
for the Go worker (reference_impl/go). A mutant that no experiment fails is
a failure of the harness, so the test fails.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.engine.environment import DEFAULT_WORKER_CMD, Settings
from harness.mutation.named import list_mutants, run_mutants

pytestmark = [pytest.mark.mutants, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "reports"
GO_WORKER = REPO / "reference_impl/go/bin/fencecheck-go-worker"


#: The Go mutants `make test` runs (about 2 minutes at load 8 instead of about
#: 8 for all 25): one per kind of rule, each with a short catcher. `make
#: go-mutants` runs every one; FENCECHECK_GO_MUTANTS="all" (or names) here too.
GO_MUTANTS_IN_MAKE_TEST = (
    "renew_rows_affected_ignored",
    "write_validation_ignored",
    "cas_without_revision",
    "requeue_without_backoff",
    "commit_unknown_as_rollback",
    "consumer_without_dedup",
    "guard_without_commit_check",
    "heartbeat_does_not_cancel",
)


def assert_all_caught(
    worker_cmd: Sequence[str],
    at_least: int,
    names_var: str,
    out: pytest.CaptureFixture[str],
    default: Sequence[str] = (),
) -> None:
    """Every mutant the worker lists (or those ``$names_var`` names, else
    ``default``; "all" for every one) is caught."""
    settings = Settings(worker_cmd=tuple(worker_cmd))
    known = {m.name for m in list_mutants(settings.worker_cmd)}
    assert len(known) >= at_least
    assert set(default) <= known, f"not mutants of the worker: {set(default) - known}"
    names = shlex.split(os.environ.get(names_var, "")) or list(default)
    if names == ["all"]:
        names = []
    # No run pages: the score is what this test asks, the pages have tests of
    # their own, and a few hundred of them cost CI most of a minute.
    code = run_mutants(settings, names, report_root=REPORTS, parallel=3, run_pages=False)
    printed = out.readouterr().out
    print(printed)
    assert code == 0, f"some mutant of `{' '.join(worker_cmd)}` was not caught:\n{printed}"


@pytest.mark.timeout(1800)
def test_every_mutant_is_caught(capsys: pytest.CaptureFixture[str]) -> None:
    assert_all_caught(DEFAULT_WORKER_CMD, 18, "FENCECHECK_MUTANTS", capsys)


@pytest.mark.timeout(1800)
def test_every_go_mutant_is_caught(capsys: pytest.CaptureFixture[str]) -> None:
    assert GO_WORKER.is_file(), f"{GO_WORKER} is missing: build it with `make setup`"
    assert_all_caught(
        (str(GO_WORKER),), 8, "FENCECHECK_GO_MUTANTS", capsys, GO_MUTANTS_IN_MAKE_TEST
    )

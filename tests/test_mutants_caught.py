"""The matrix can fail: every mutant of the reference worker must be caught.

Runs `fencecheck mutants` (all mutants, each against its expected catchers,
then the rest of the matrix if needed). A mutant that no experiment fails is
a failure of the harness, so this test fails.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from harness.engine.environment import DEFAULT_WORKER_CMD, Settings
from harness.mutation.named import list_mutants, run_mutants

pytestmark = [pytest.mark.mutants, pytest.mark.slow]

REPORTS = Path(__file__).resolve().parent.parent / "reports"


@pytest.mark.timeout(1800)
def test_every_mutant_is_caught(capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(worker_cmd=DEFAULT_WORKER_CMD)
    assert len(list_mutants(settings.worker_cmd)) >= 18
    names = shlex.split(os.environ.get("FENCECHECK_MUTANTS", ""))
    code = run_mutants(settings, names, report_root=REPORTS, parallel=3)
    out = capsys.readouterr().out
    print(out)
    assert code == 0, f"some mutant was not caught:\n{out}"

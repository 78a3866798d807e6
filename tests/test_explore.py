"""Exploration can fail, and does not fail the correct implementation.

Two short fixed-seed campaigns through the command line, on real parts: one
against the reference worker (no violation; every schedule's fault took
effect or is counted apart), one against a named mutant that must be found,
shrunk, written as a schedule file and replayed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.explore import schedule as sched

pytestmark = pytest.mark.slow

# Leases a thousand times too long: every grant breaks the lease-duration
# invariant, so any schedule finds it; the test proves the path from a
# violation to a shrunk, replayable schedule file.
MUST_FIND = "lease_granted_in_seconds"


def _report(root: Path) -> tuple[Path, dict[str, object]]:
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run, json.loads((run / "explore.json").read_text())


@pytest.mark.timeout(600)
def test_a_short_campaign_finds_no_violation_in_the_reference_worker(tmp_path: Path) -> None:
    code = cli_main(
        ["explore", "--schedules", "4", "--seed", "7", "--report-dir", str(tmp_path), "--quiet"]
    )
    run, facts = _report(tmp_path)
    counts = facts["counts"]
    assert isinstance(counts, dict)
    assert counts["fail"] == 0, (run / "summary.md").read_text()
    assert code == (0 if counts["pass"] else 2)
    assert facts["schedules"] == 4
    for name in ("summary.md", "results.json", "junit.xml"):
        assert (run / name).is_file()
    assert len(list((run / "archives").glob("X-s*.yaml"))) == 4
    assert "Coverage" in (run / "summary.md").read_text()


@pytest.mark.timeout(600)
def test_a_campaign_finds_shrinks_and_replays_a_mutant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(
        [
            "explore", "--schedules", "2", "--seed", "3", "--mutant", MUST_FIND,
            "--shrink-budget", "20s", "--report-dir", str(tmp_path / "explore"),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1, out
    run, facts = _report(tmp_path / "explore")
    first = facts["first_violation"]
    assert isinstance(first, dict)
    assert "lease.expiry_within_lease_duration" in first["broken"]
    (minimal,) = [p for p in (run / "violations").glob("*.yaml") if ".archive" not in p.name]
    assert "replay: .venv/bin/fencecheck replay" in out
    schedule = sched.load(minimal)
    assert schedule.note.startswith("breaks ")
    code = cli_main(
        ["replay", str(minimal), "--mutant", MUST_FIND, "--report-dir", str(tmp_path / "replay")]
    )
    assert code == 1, capsys.readouterr().out

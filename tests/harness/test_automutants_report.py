"""The report of a generated-mutant campaign (`fencecheck mutants --auto`):
score and interval, times, triage applied after the run, results.json,
summary.md, the HTML index and the seal, rebuilt from the run's journal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.mutation import auto_report
from harness.mutation.auto import JOURNAL, RUN_FILE
from harness.mutation.triage import Survivor, Triage


def test_wilson_interval_matches_known_values() -> None:
    assert auto_report.wilson(0, 0) is None
    lo, hi = auto_report.wilson(0, 10) or (1.0, 0.0)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = auto_report.wilson(90, 100) or (0.0, 0.0)
    assert lo == pytest.approx(0.8256, abs=1e-4) and hi == pytest.approx(0.9448, abs=1e-4)


def test_percentiles_interpolate() -> None:
    values = [float(v) for v in range(1, 11)]
    assert auto_report.percentile(values, 50) == 5.5
    assert auto_report.percentile(values, 90) == pytest.approx(9.1)
    assert auto_report.percentile([], 90) is None


def _entry(n: int, status: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"reference_impl/x.py:f:negate_compare:{n:08x}",
        "language": "python",
        "path": "reference_impl/x.py",
        "line": n,
        "scope": "f",
        "operator": "negate_compare",
        "change": "negate_compare: `a < b` -> `a >= b`",
        "status": status,
        "caught_by": ["K"] if status == "caught" else [],
        "wall_s": float(n),
        "verdicts": {"K": "fail"} if status == "caught" else {"K": "pass"},
        "detail": "",
        "note": None,
        "should_be_caught_by": ["K", "B"],
        "diff": None,
        **extra,
    }


def _campaign(folder: Path) -> None:
    folder.mkdir()
    run = {"command": "fencecheck mutants --auto --sample 6 --seed 1", "generated": 60}
    (folder / RUN_FILE).write_text(json.dumps(run))
    entries = [
        _entry(1, "caught"),
        _entry(2, "caught"),
        _entry(3, "caught"),
        _entry(4, "survived", diff="-a < b\n+a >= b"),
        _entry(5, "survived"),
        _entry(6, "error", detail="migrate: boom"),
        _entry(7, "not_run"),
    ]
    (folder / JOURNAL).write_text("".join(json.dumps(e) + "\n" for e in entries))


def test_rebuild_applies_todays_triage_and_writes_every_report_file(tmp_path: Path) -> None:
    folder = tmp_path / "automutants-x"
    _campaign(folder)
    survivor = _entry(4, "survived")["id"]
    equivalent = _entry(5, "survived")["id"]
    judged = Triage(
        equivalent={equivalent: "only logged"},
        survivors={survivor: Survivor("no stale write", "B (stale write after takeover)")},
    )
    data = auto_report.rebuild(folder, judged, {equivalent: "-x\n+y"})
    assert data["counts"] == {
        "caught": 3,
        "survived": 1,
        "equivalent": 1,
        "error": 1,
        "unconfirmed": 0,
        "not_run": 1,
    }
    assert data["score"] == 0.75 and data["score_ci95"][0] < 0.75 < data["score_ci95"][1]
    # Times are over the mutants that ran: 1 to 6 (the equivalent too: it ran before triage).
    assert data["time_per_mutant"]["median_s"] == 3.5
    moved = next(e for e in data["mutants"] if e["id"] == equivalent)
    assert moved["status_in_run"] == "survived" and moved["note"] == "only logged"
    summary = (folder / "summary.md").read_text()
    assert "**75.0%**" in summary and "+a >= b" in summary
    assert "breaks: no stale write; should be caught by: B" in summary
    assert json.loads((folder / "results.json").read_text())["kind"] == "automutants"
    printed = auto_report.publish(folder)
    assert "NOT WRITTEN" not in printed and (folder / "MANIFEST.sha256").is_file()
    page = (folder / "index.html").read_text()
    assert page.count("<tr class=") == 7 and 'data-status="survived"' in page
    assert 'data-verdict="fail"' in page  # a survivor is the harness failing


def test_a_survivor_not_analysed_names_the_nearest_experiments(tmp_path: Path) -> None:
    text = auto_report.survivors_text([_entry(4, "survived", diff="-a\n+b")])
    assert "not analysed yet; the experiments nearest to it: K, B" in text
    assert "    +b" in text


def test_fencecheck_report_rebuilds_an_automutants_folder(tmp_path: Path) -> None:
    from harness.cli import main as cli_main

    folder = tmp_path / "automutants-y"
    _campaign(folder)
    auto_report.rebuild(folder, Triage())
    assert cli_main(["report", str(folder)]) == 0
    assert 'data-status="caught"' in (folder / "index.html").read_text()


def test_mutants_rebuild_report_uses_the_triage_file_given(tmp_path: Path) -> None:
    from harness.cli import main as cli_main

    folder = tmp_path / "automutants-z"
    _campaign(folder)
    triage_file = tmp_path / "triage.yaml"
    equivalent = _entry(5, "survived")["id"]
    triage_file.write_text(f"equivalent:\n  - id: {equivalent}\n    reason: only logged\n")
    args = ["mutants", "--rebuild-report", str(folder), "--triage", str(triage_file)]
    assert cli_main([*args, "--no-pages"]) == 0
    data = json.loads((folder / "results.json").read_text())
    assert data["counts"]["equivalent"] == 1 and data["counts"]["survived"] == 1
    assert cli_main(["mutants", "--rebuild-report", str(tmp_path)]) == 64

"""Every `fencecheck run` writes its pages and seals its folder; a mutants
folder gets an index over its mutants' runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.evidence import manifest
from harness.evidence.html.mutants import write_mutants_pages
from tests.report.test_pages import by_attr, parse


@pytest.mark.slow
def test_a_real_run_writes_pages_and_a_manifest(tmp_path: Path) -> None:
    # A process of its own, as CI runs it (the command installs signal handlers).
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "B", "--quiet", "--report-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    run = (tmp_path / "latest").resolve()
    index = parse(run / "index.html")
    assert [r.attrib["data-experiment"] for r in by_attr(index, "data-experiment")] == ["B"]
    assert (run / "experiments" / "B.html").is_file()
    assert manifest.verify_report(run).intact
    digest = manifest.run_digest(run)
    assert f"evidence digest {digest}" in out
    assert main(["verify", str(run), "--digest", digest]) == 0


@pytest.mark.slow
def test_no_pages_seals_the_evidence_and_report_builds_them_later(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "A", "--quiet", "--no-pages",
         "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run = (tmp_path / "latest").resolve()
    assert not (run / "index.html").exists()
    assert "pages not written (--no-pages" in done.stdout
    assert manifest.verify_report(run).intact
    assert main(["report", str(run)]) == 0
    assert (run / "experiments" / "A.html").is_file() and manifest.verify_report(run).intact


def test_mutants_folder_pages(run_fail: Path, tmp_path: Path) -> None:
    folder = tmp_path / "mutants-x"
    folder.mkdir()
    shutil.copytree(run_fail, folder / "write_ignores_epoch")
    (folder / "mutants.json").write_text(
        json.dumps(
            [
                {
                    "mutant": "write_ignores_epoch",
                    "rule": 2,
                    "expected": ["B"],
                    "caught_by": ["B"],
                    "detail": "B: invariant broken",
                },
                {"mutant": "never_ran", "rule": 1, "expected": ["K"], "caught_by": []},
            ]
        )
    )
    index = parse(write_mutants_pages(folder, run_pages=False))
    assert not (folder / "write_ignores_epoch" / "experiments").exists()
    assert f"not built: fencecheck report {folder}" in (folder / "index.html").read_text()
    index = parse(write_mutants_pages(folder))
    rows = {
        r.attrib["data-mutant"]: r.attrib["data-verdict"] for r in by_attr(index, "data-mutant")
    }
    assert rows == {"write_ignores_epoch": "pass", "never_ran": "fail"}
    assert (folder / "write_ignores_epoch" / "experiments" / "B.html").is_file()
    manifest.write_manifest(folder)
    assert manifest.verify_report(folder).intact
    (folder / "index.html").write_text("tampered")
    assert main(["report", str(folder)]) == 0, "rebuilt in place from mutants.json and the runs"
    assert "write_ignores_epoch" in (folder / "index.html").read_text()
    assert manifest.verify_report(folder).intact


def test_an_interrupted_run_says_so_on_its_index_and_a_deadline_cuts_pages(
    run_pass: Path,
) -> None:
    from harness.evidence.html import PagesCut, write_run_pages

    (run_pass / "results.json").write_text(
        json.dumps({"run": {"status": "interrupted", "interrupted": "interrupted by SIGTERM"}})
    )
    text = write_run_pages(run_pass).read_text()
    assert "Interrupted run (interrupted by SIGTERM)" in text
    (run_pass / "index.html").unlink()
    with pytest.raises(PagesCut, match="0 of"):
        write_run_pages(run_pass, deadline=0.0)  # a stop's deadline long past
    assert not (run_pass / "index.html").exists(), "no index over a part of the pages"

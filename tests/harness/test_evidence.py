"""Evidence archives: schema, masking, atomic writes; reports; CLI usage errors."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from harness.evidence import archive as evidence
from harness.evidence.summary import ExperimentResult, write_junit, write_summary
from harness.verdict import Verdict
from tests.harness.helpers import sample_archive


def test_archive_validates_masks_and_writes_atomically(tmp_path: Path) -> None:
    path = evidence.write_archive(
        tmp_path / "B.yaml", sample_archive(observed_result="dsn password=hunter2 host=x")
    )
    written = yaml.safe_load(path.read_text())
    request = written["mock_tool_request_log"][0]["request"]
    assert request == {"card_number": evidence.MASK, "password": evidence.MASK}
    assert "hunter2" not in path.read_text()
    assert written["pass_or_fail"] == "pass", "pass_or_fail must not be mistaken for a secret"
    assert [p.name for p in tmp_path.iterdir()] == ["B.yaml"], "a temp file was left behind"


def test_archive_missing_field_is_refused_and_nothing_written(tmp_path: Path) -> None:
    broken = sample_archive()
    del broken["expected_invariant"]
    with pytest.raises(evidence.ArchiveInvalid, match="expected_invariant"):
        evidence.write_archive(tmp_path / "B.yaml", broken)
    assert list(tmp_path.iterdir()) == []


def test_bad_verdict_is_refused(tmp_path: Path) -> None:
    with pytest.raises(evidence.ArchiveInvalid, match="pass_or_fail"):
        evidence.write_archive(tmp_path / "B.yaml", sample_archive(pass_or_fail="maybe"))


def test_verdict_merge_and_exit_codes() -> None:
    from harness.verdict import exit_code

    assert Verdict.merge([Verdict.PASS, Verdict.UNKNOWN]) is Verdict.UNKNOWN
    assert Verdict.merge([Verdict.UNKNOWN, Verdict.FAIL]) is Verdict.FAIL
    assert Verdict.merge([]) is Verdict.UNKNOWN
    assert [exit_code(v) for v in (Verdict.PASS, Verdict.FAIL, Verdict.UNKNOWN)] == [0, 1, 2]


def _result(verdict: Verdict) -> ExperimentResult:
    return ExperimentResult(
        "B", "old owner resumes", None, 0, verdict, "why", 1.5, 0.8, None, "inv"
    )


def test_junit_and_summary(tmp_path: Path) -> None:
    results = [_result(Verdict.PASS), _result(Verdict.FAIL), _result(Verdict.UNKNOWN)]
    root = ET.parse(write_junit(tmp_path / "j.xml", results, suite="s")).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "1", "1")
    text = write_summary(tmp_path / "s.md", results, header={"run": "x"}, wall_s=3).read_text()
    assert "overall verdict**: fail" in text


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_list_names_every_experiment_by_layer() -> None:
    proc = _cli("list")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("== ")]
    assert [lines[i].split(":")[0] for i in heads] == [
        "== the queue layer",
        "== the workflow layer",
    ]

    def ids(block: list[str]) -> list[str]:
        return [line.split()[0] for line in block if line and not line[0].isspace()]

    queue, workflow = ids(lines[heads[0] + 1 : heads[1]]), ids(lines[heads[1] + 1 :])
    assert queue == ["B", "K", "P", "Q", "R", "S", "X", "Z"]
    assert sorted(set(queue + workflow)) == list("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert "S  link faults (variants: tool_cut" in proc.stdout  # S's tool calls: workflow


def test_cli_missing_pg_binaries_named(tmp_path: Path) -> None:
    proc = _cli("smoke", "--pg-bin", str(tmp_path))
    assert proc.returncode == 64
    assert "lacks initdb" in proc.stderr


def test_go_version_recorded_only_for_a_go_worker() -> None:
    """The archive names the Go version a worker binary was built with, by asking
    `go version BINARY`, not by looking for "go" in the command line."""
    go_worker = evidence.REPO_ROOT / "reference_impl/go/bin/fencecheck-go-worker"
    assert go_worker.is_file(), "build the Go worker first: make setup"
    built = evidence.go_build_version((str(go_worker),))
    assert built is not None and built.startswith("go1.")
    assert evidence.runtime_versions(go_worker=built, toxiproxy=None)["go"] == built
    assert evidence.go_build_version((sys.executable, "-m", "reference_impl.worker")) is None
    assert "go" not in evidence.runtime_versions(go_worker=None, toxiproxy=None)
    # the binary's digest, not the Python package's (its path contains "reference_impl")
    assert evidence.worker_digest((str(go_worker),)) != evidence.digest_paths(
        [evidence.REPO_ROOT / "reference_impl"]
    )


def test_summary_cells_keep_one_row_per_experiment() -> None:
    from harness.evidence.summary import cell

    assert cell("a\nb | c\r\nd") == "a<br>b \\| c<br>d"


def test_observed_values_print_plain() -> None:
    import datetime as dt
    import uuid

    from harness.engine.experiment import plain

    when = dt.datetime(2026, 12, 1, 5, 24, 39, 676076, tzinfo=dt.UTC)
    rid = uuid.UUID("0b6c2f1e-aaaa-4bbb-8ccc-000000000000")
    text = plain({"at": when, "run": rid, "rows": [(1, "x", None)], "one": (2,)})
    assert "datetime" not in text and "UUID(" not in text
    assert text == (
        "{'at': 2026-12-01T05:24:39.676076+00:00, 'run': 0b6c2f1e-aaaa-4bbb-8ccc-000000000000, "
        "'rows': [(1, 'x', None)], 'one': (2,)}"
    )

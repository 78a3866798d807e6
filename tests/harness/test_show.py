"""`fencecheck show` checks the file against the published archive schema and
says what is wrong with it (exit 64, one message, no traceback)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from harness.evidence import archive as evidence
from tests.harness.helpers import sample_archive
from tests.harness.outside import REPO


def _show(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "show", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _valid(path: Path) -> Path:
    return evidence.write_archive(path, sample_archive(seed=7, interrupted=None))


def test_a_valid_archive_is_shown(tmp_path: Path) -> None:
    proc = _show(_valid(tmp_path / "B.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("B: old owner resumes") and "seed:       7" in proc.stdout


def _truncated(path: Path) -> None:
    lines = _valid(path).read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: len(lines) // 3]))


def _bad_yaml(path: Path) -> None:
    path.write_text("experiment_id: B\ntitle: [unclosed\n")


def _binary(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 4)


def _binary_utf8(path: Path) -> None:
    path.write_bytes(b"experiment_id: B\n\x00\x00\x00")


def _not_an_archive(path: Path) -> None:
    path.write_text(yaml.safe_dump({"name": "a config file", "port": 5432}))


def _a_list(path: Path) -> None:
    path.write_text("- one\n- two\n")


def _empty(path: Path) -> None:
    path.write_text("")


def _wrong_field(path: Path) -> None:
    path.write_text(yaml.safe_dump(sample_archive(pass_or_fail="maybe")))


CASES: list[tuple[Callable[[Path], None], list[str]]] = [
    (_truncated, ["does not match its schema", "missing field(s): ", "natural_wait_s"]),
    (_bad_yaml, ["not valid YAML at line 3", "truncated or edited"]),
    (_binary, ["not UTF-8 text"]),
    (_binary_utf8, ["binary file"]),
    (_not_an_archive, ["missing field(s): archive_version, experiment_id", "name"]),
    (_a_list, ["top level is a list, not a mapping"]),
    (_empty, ["top level is empty"]),
    (_wrong_field, ["pass_or_fail", "'maybe' is not one of"]),
]


@pytest.mark.parametrize(("make", "expected"), CASES, ids=[c[0].__name__[1:] for c in CASES])
def test_a_bad_file_is_a_usage_error_saying_what_is_wrong(
    tmp_path: Path, make: Callable[[Path], None], expected: list[str]
) -> None:
    path = tmp_path / "X.yaml"
    make(path)
    proc = _show(path)
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert str(path) in proc.stderr
    for text in expected:
        assert text in proc.stderr, proc.stderr


def test_a_directory_is_not_an_archive(tmp_path: Path) -> None:
    proc = _show(tmp_path)
    assert proc.returncode == 64 and "is a directory, not a regular file" in proc.stderr
    proc = _show(tmp_path / "missing.yaml")
    assert proc.returncode == 64 and "no archive at" in proc.stderr

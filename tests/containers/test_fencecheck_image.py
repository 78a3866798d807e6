"""The fencecheck image (`make image`) runs experiments with no other service.

Built (from the cached layers after the first time) and run exactly as
docs/ci.md says, with the podman command line: the run directory lands on the
host volume with the commit and the image recorded, the container runs as a
non-root user, a /reports it cannot write is refused with the fixes, and no
container, network or volume is left behind.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.evidence.archive import git_commit
from tests.containers.conftest import require_engine

pytestmark = [pytest.mark.containers, pytest.mark.slow]


@pytest.fixture(scope="module")
def image() -> str:
    require_engine()
    from harness.backends.fencecheck_image import build

    figures = build()
    return str(figures["image"])


def _podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    from harness.backends.containers_setup import podman_env

    return subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout
    )


def _engine_objects() -> dict[str, set[str]]:
    return {
        kind: set(_podman(*argv).stdout.split())
        for kind, argv in (
            ("containers", ("ps", "-aq")),
            ("networks", ("network", "ls", "-q")),
            ("volumes", ("volume", "ls", "-q")),
        )
    }


@pytest.mark.timeout(600)
def test_the_image_runs_experiments_and_leaves_nothing(image: str, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    before = _engine_objects()
    proc = _podman(
        "run",
        "--rm",
        "-v",
        f"{reports}:/reports:U",
        image,
        "run",
        "A",
        "K",
        "--seed",
        "3",
        "--quiet",
        "--fail-on",
        "unknown",
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # A, and K once per write path (fast, stepped).
    assert (
        proc.stdout.strip().splitlines()[-1] == "fencecheck: exit 0: all 3 experiment run(s) passed"
    )
    assert _engine_objects() == before, "the run left a container, network or volume"
    (run_dir,) = [d for d in reports.iterdir() if d.is_dir() and not d.is_symlink()]
    record = json.loads((run_dir / "shard.json").read_text())
    assert record["git_commit"] == git_commit()
    archive = yaml.safe_load((run_dir / "archives" / "K-fast.yaml").read_text())
    assert archive["deployment"]["inside_image"] == image
    assert archive["git_commit"] == git_commit()
    assert archive["postgres_version"].startswith("PostgreSQL 18.")


def test_the_image_runs_as_a_non_root_user(image: str) -> None:
    proc = _podman("run", "--rm", "--entrypoint", "id", image, "-u")
    assert proc.returncode == 0 and proc.stdout.strip() == "10001"


def test_an_arbitrary_uid_brings_up_every_part(image: str) -> None:
    """`--user` with a uid the image does not know: initdb needs a passwd entry."""
    proc = _podman("run", "--rm", "--user", "4242:4242", image, "smoke", timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_an_unwritable_reports_volume_is_refused_with_the_fixes(image: str, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir(mode=0o755)  # owned by the test's user, not the image's
    proc = _podman("run", "--rm", "-v", f"{reports}:/reports", image, "run", "A")
    assert proc.returncode == 64
    assert "not writable by uid 10001" in proc.stderr and ":U" in proc.stderr

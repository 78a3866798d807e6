"""No engine reachable: a clear BackendUnavailable, never a traceback or a hang.

These run without an engine (that is the point); only the docker-py import
decides which message is expected.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.backends.base import BackendUnavailable, make_backend
from harness.parts.pg_binaries import PgBinaries

pytestmark = pytest.mark.containers

HAS_DOCKER = all(importlib.util.find_spec(m) for m in ("docker", "testcontainers"))
REPO = Path(__file__).resolve().parents[2]


def test_missing_socket_in_docker_host_names_the_variable_and_the_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_binaries: PgBinaries
) -> None:
    missing = tmp_path / "no-such-engine.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{missing}")
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as info:
        make_backend("containers", pg_binaries, None)
    message = str(info.value)
    assert time.monotonic() - started < 15, "an unreachable engine must fail fast"
    assert "make containers-setup" in message
    if HAS_DOCKER:
        assert f"DOCKER_HOST=unix://{missing}" in message
    else:
        assert "pip install -e '.[containers]'" in message


@pytest.mark.skipif(not HAS_DOCKER, reason="needs docker-py (pip install -e '.[containers]')")
def test_no_docker_host_and_no_socket_lists_what_was_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_binaries: PgBinaries
) -> None:
    import harness.backends.containers as containers

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(containers, "PROJECT_SOCKET", tmp_path / "podman.sock")
    monkeypatch.setattr(containers, "DEFAULT_SOCKETS", (str(tmp_path / "docker.sock"),))
    with pytest.raises(BackendUnavailable) as info:
        make_backend("containers", pg_binaries, None)
    message = str(info.value)
    assert "DOCKER_HOST is not set" in message
    assert str(tmp_path / "podman.sock") in message and str(tmp_path / "docker.sock") in message
    assert "make containers-setup" in message and "apt" in message


def test_cli_exits_64_with_the_message_and_leaves_nothing(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "DOCKER_HOST": f"unix://{tmp_path / 'missing.sock'}",
        "HOME": str(tmp_path),
        "TMPDIR": str(temp),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "A", "--backend", "containers",
         "--report-dir", str(tmp_path / "reports")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert "make containers-setup" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(temp.iterdir()) == [], "no temp directory may be left behind"

"""Containers never outlive their run: close(), interrupt, and a killed harness.

Every container and network carries the run's labels (owner pid, its start
time, host). close() removes them; a harness killed with SIGKILL cannot, so
the next backend start removes whatever belongs to a dead owner.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.parts.pg_binaries import PgBinaries
from harness.waiting import wait_for
from tests.containers.conftest import engine_problem, require_engine

pytestmark = [pytest.mark.containers, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _ours(client: Any, **labels: str) -> list[str]:
    from harness.backends.containers import LABEL_RUN, container_name, listed_containers

    filters = [LABEL_RUN] + [f"{k}={v}" for k, v in labels.items()]
    return sorted(container_name(e) for e in listed_containers(client, {"label": filters}))


def test_close_removes_every_container_and_the_network(
    client: Any, pg_binaries: PgBinaries, tmp_path: Path
) -> None:
    from harness.backends.containers import LABEL_RUN, ContainerBackend
    from harness.parts.processes import ProcessRegistry

    backend = ContainerBackend.create(binaries=pg_binaries)
    try:
        backend.start_toxiproxy(tmp_path / "logs", ProcessRegistry())
        backend.start_primary(tmp_path / "pg", "primary")
        backend.start_mock_tool(tmp_path / "tool", tmp_path / "tool.log", None)
        assert len(_ours(client, **{LABEL_RUN: backend.run_id})) == 3
    finally:
        backend.close()
    assert backend.leftovers() == []
    assert _ours(client, **{LABEL_RUN: backend.run_id}) == []


CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from harness.backends.containers import ContainerBackend
    from harness.parts.pg_binaries import find_pg_binaries
    backend = ContainerBackend.create(binaries=find_pg_binaries())
    backend.start_primary(Path(sys.argv[1]), "primary")
    print(backend.run_id, flush=True)
    time.sleep(600)
    """
)


def test_leftovers_of_a_killed_run_are_removed_at_the_next_start(
    client: Any, pg_binaries: PgBinaries, tmp_path: Path
) -> None:
    from harness.backends.containers import LABEL_RUN, ContainerBackend

    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "pg")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        run_id = child.stdout.readline().strip()
        assert run_id, "the child did not start its backend"
        child.kill()  # SIGKILL: no close(), no atexit
        child.wait(timeout=10)
        left = _ours(client, **{LABEL_RUN: run_id})
        assert left, "a SIGKILLed harness leaves its containers (that is what is cleaned)"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    backend = ContainerBackend.create(binaries=pg_binaries)
    try:
        assert set(left) <= set(backend.removed_leftovers)
        assert f"fencecheck-{run_id}" in backend.removed_leftovers  # its network
        assert not list(Path(tempfile.gettempdir()).glob(f"fencecheck-{run_id}-*")), "its temp dir"
        assert _ours(client, **{LABEL_RUN: run_id}) == []
        # A live owner's containers (this backend's own) are never touched.
        from harness.backends.containers import cleanup_leftovers

        backend.start_primary(tmp_path / "pg2", "alive")
        assert cleanup_leftovers(client) == []
        assert len(_ours(client, **{LABEL_RUN: backend.run_id})) == 1
    finally:
        backend.close()


def test_interrupted_cli_run_leaves_no_container(client: Any, tmp_path: Path) -> None:
    from harness.backends.containers import LABEL_PID

    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", "H", "--backend", "containers",
         "--report-dir", str(tmp_path / "reports"), "--quiet"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    try:
        # H starts a primary and a standby of its own per variant: wait for them.
        wait_for(
            lambda: any("-pg-replica-" in n for n in _ours(client, **{LABEL_PID: str(proc.pid)})),
            what="the run's standby containers",
            timeout_s=120,
        )
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out
    # The stop is bounded (5 s); what a busy engine had not removed by then is
    # named in the run record, and the next run, or `fencecheck clean`, removes it.
    clean = subprocess.run(
        [sys.executable, "-m", "harness.cli", "clean"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert _ours(client, **{LABEL_PID: str(proc.pid)}) == []
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("fencecheck-")]
    assert left == [], left


def test_engine_problem_is_none_here() -> None:
    require_engine()
    assert engine_problem() is None


def test_a_container_removed_after_the_listing_counts_as_removed(client: Any) -> None:
    """An interrupted run's own teardown can remove a container between the next
    sweep's listing and its removal: the sweep takes it as gone, not as something
    it could not remove. (Podman answers 404 once it is gone and 500 "no such
    container" while its removal is under way; the sweep lists without inspecting
    each container, where a CI run met the 500.)"""
    from harness.backends import containers_images as images
    from harness.backends.containers import LABEL_RUN, listed_containers, remove_listed

    label = f"{LABEL_RUN}=race-{os.getpid()}"
    created = client.containers.create(
        images.python_image(), command=["true"], labels={LABEL_RUN: f"race-{os.getpid()}"}
    )
    try:
        (entry,) = listed_containers(client, {"label": label})
        created.remove(force=True)  # the other party wins the race
        assert remove_listed(client, entry) is None
        assert listed_containers(client, {"label": label}) == []
    finally:
        with contextlib.suppress(Exception):
            created.remove(force=True)

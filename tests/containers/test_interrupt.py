"""SIGTERM stops a run on the container backend within the 5 s bound.

The engine removes a container in about a second, serialised, and much
slower under load; the stop kills and prunes every container of the run at
once, and whatever the engine has not removed by the deadline stays named in
the run record, so `fencecheck clean` removes it: nothing is lost track of.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.containers.test_cleanup import _ours
from tests.harness import outside

pytestmark = [pytest.mark.containers, pytest.mark.slow]


def test_sigterm_stops_a_containers_run(client: Any, tmp_path: Path) -> None:
    run = outside.start(["run", "B", "D", "--backend", "containers"], tmp_path)
    try:
        run.wait_file("*/logs/D-*/A.events.jsonl", contains='"op":"save_checkpoint"', timeout_s=240)
        sent = run.signal(signal.SIGTERM)
        code, ended, seen = run.finish()
        took = ended - sent
        print(f"containers SIGTERM: exit {code} {took:.2f}s after the signal")
        assert code == 143, run.output
        assert took < 5.0, run.output
        results = json.loads(next(run.reports.glob("*/results.json")).read_text())
        assert results["run"]["status"] == "interrupted"
        # A reaper the stopped run handed its records to is part of the stop
        # (what the engine had not removed by the deadline): judged once it
        # has ended or run out of its bound, as `outside.leftovers` does. Under
        # load (CI, 2026-12-07) it was still removing when this looked at once.
        outside.reapers_done(run.tmpdir)
        assert outside.alive(seen.pids) == []
        clean = subprocess.run(
            [sys.executable, "-m", "harness.cli", "clean"],
            cwd=outside.REPO, env={**os.environ, "TMPDIR": str(run.tmpdir)},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert clean.returncode == 0, clean.stdout + clean.stderr
        print(clean.stdout)
        assert outside.leftovers(seen, run.tmpdir) == []
        assert [n for n in _ours(client) if "fencecheck-" in n and _dead_owner(client, n)] == []
    finally:
        run.close()


def _dead_owner(client: Any, name: str) -> bool:
    from harness.backends.containers import owner_alive

    return not owner_alive(client.containers.get(name).labels)

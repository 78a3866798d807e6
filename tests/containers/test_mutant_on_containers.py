"""The matrix can fail on the container backend too: a mutant is caught.

H runs its own container primary and standby; the mutant
``assumes_sync_replication`` declares the synchronous contract while the
deployment replicates asynchronously, and H[async] must say so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.engine.environment import DEFAULT_WORKER_CMD
from harness.mutation.named import list_mutants

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.mutants]
REPO = Path(__file__).resolve().parents[2]
MUTANT = "assumes_sync_replication"


def test_h_catches_a_mutant_on_containers(engine_ready: None, tmp_path: Path) -> None:
    known = [m.name for m in list_mutants(DEFAULT_WORKER_CMD)]
    assert MUTANT in known, f"the reference worker has no mutant {MUTANT}: {known}"
    reports = tmp_path / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "H", "--mutant", MUTANT,
         "--backend", "containers", "--report-dir", str(reports), "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (run_dir,) = [p for p in reports.iterdir() if p.is_dir() and not p.is_symlink()]
    results = json.loads((run_dir / "results.json").read_text())["results"]
    verdicts = {(r["experiment"], r["variant"]): r["verdict"] for r in results}
    assert verdicts.get(("H", "async")) == "fail", verdicts
    archive = (run_dir / "archives" / "H-async.yaml").read_text()
    assert "kind: containers" in archive

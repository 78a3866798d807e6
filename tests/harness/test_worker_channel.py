"""What a worker prints on its ops channel that is not a reply is evidence:
kept in the archive (and its stdout log), and named when it costs a reply."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness.outside import REPO

pytestmark = pytest.mark.slow


def test_non_json_lines_land_in_the_archive(tmp_path: Path) -> None:
    worker = tmp_path / "chatty-worker"
    worker.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = ops ]; then echo "chatty worker: hello on stdout"; fi\n'
        f'exec {sys.executable} -m reference_impl.worker "$@"\n'
    )
    worker.chmod(0o755)
    reports = tmp_path / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "A", "--worker-cmd", str(worker),
         "--report-dir", str(reports), "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [p for p in reports.iterdir() if not p.is_symlink()]
    archive_path = run_dir / "archives" / "A.yaml"
    archive = yaml.safe_load(archive_path.read_text())
    noise = archive["worker_channel_errors"]
    assert noise and all(
        lines == ["not a reply: b'chatty worker: hello on stdout\\n'"] for lines in noise.values()
    ), noise
    logs = sorted((run_dir / "logs" / "A").glob("worker-*.stdout.log"))
    assert logs and all(p.read_text().startswith("chatty worker: hello") for p in logs)

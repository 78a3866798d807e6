"""An escalated stop that runs out of time hands its run records to a reaper:
the command still exits at once, and what it could not remove is gone soon
after, without `fencecheck clean`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.waiting import wait_for

# A command whose escalation cannot finish: its one escalation step blocks
# (as removing a large campaign's scratch does on a loaded machine).
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from pathlib import Path
    from harness import stopping
    from harness.cli import _hand_over_records
    from harness.engine.run_records import RunRecord

    began = time.time()
    stopping.install()
    record = RunRecord.create(base=Path(sys.argv[1]), kind="test")
    (record.temp_root / "data").write_bytes(b"x" * 4096)
    stopping.on_escalate(lambda why: time.sleep(60))
    stopping.on_unfinished(lambda: _hand_over_records(began))
    print(record.path, record.temp_root, flush=True)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
    """
)


def test_a_stop_out_of_time_hands_its_records_to_a_reaper(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=20,
        env=env,
        check=False,
    )
    assert done.returncode == 130, done.stderr
    record_path, temp_root = (Path(p) for p in done.stdout.split())
    assert "a reaper (pid" in done.stderr, done.stderr
    wait_for(
        lambda: not record_path.exists() and not temp_root.exists(),
        timeout_s=15,
        what=f"the reaper to remove {temp_root} and its record",
    )

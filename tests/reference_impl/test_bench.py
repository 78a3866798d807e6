"""``python -m reference_impl.bench`` works end to end (figures only; no timing assertion)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from reference_impl.bench import SIDES, pgbench_sql, protected_write_script
from reference_impl.queries import Queries

ROOT = Path(__file__).resolve().parents[2]
RATIO = re.compile(
    r"^  ratio (checkpoint|renew|claim)\s+impl/(\w+)\s+([0-9.]+)x\s+target >= ([0-9.]+)x\s+(met|NOT met)",
    re.M,
)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FENCECHECK_")}


def _bench(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "reference_impl.bench", *args],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _work_dir(header: str) -> Path:
    match = re.search(r"work dir (\S+)", header)
    assert match, header
    return Path(match.group(1))


def _nothing_left(work: Path) -> None:
    assert not work.exists()
    mine = [
        p.info["pid"]
        for p in psutil.process_iter(["pid", "cmdline"])
        if any(str(work) in part for part in (p.info["cmdline"] or []))
    ]
    assert mine == []


def test_scripts_are_the_implementations_statements() -> None:
    q = Queries.load()
    assert pgbench_sql(q.sql("renew")).startswith("SELECT outcome, lease_expires_at FROM")
    assert ":run_id, :owner, :epoch, :ttl_ms" in pgbench_sql(q.sql("renew"))
    script = protected_write_script(q.sql("protected_write_fast"))
    assert "fencecheck.protected_write_fast(" in script
    assert script.startswith("SELECT revision AS expected_revision,")
    assert "gen_random_uuid()" in script and script.endswith(" \\gset\n")
    assert "%(" not in script


def test_prints_figures_and_three_ratios() -> None:
    proc = _bench("--seconds", "0.2", "--rounds", "1")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    ratios = {m.group(1): m for m in RATIO.finditer(out)}
    assert set(ratios) == {"checkpoint", "renew", "claim"}, out
    assert ratios["checkpoint"].group(2) == "seed6"
    for op, m in ratios.items():
        assert float(m.group(3)) > 0
        assert m.group(2) == SIDES[op][0]
    assert re.search(r"round 1: seed6 .* seed7 .* stmt .* impl .* impl/seed6", out)
    assert re.search(r"ratio impl/seed6 .*; impl/seed7 \d+\.\d+x", out)
    _nothing_left(_work_dir(out))


def test_ctrl_c_leaves_nothing_behind() -> None:
    proc = _bench("--seconds", "30", "--rounds", "3", "--ops", "renew")
    assert proc.stdout is not None
    header = proc.stdout.readline()
    work = _work_dir(header)
    deadline = time.monotonic() + 120
    while "renew:" not in proc.stdout.readline():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"the benchmark did not start measuring: {proc.stderr}")
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    _nothing_left(work)

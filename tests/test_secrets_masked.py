"""No plaintext secret reaches an archive or a log: every run the matrix creates
carries a sensitive field (``customer_token``, shape ``ct_`` + 24 hex digits);
after a real experiment that sends it through a worker, the database and the
tool, neither the evidence archive nor any file of the experiment's logs holds
it in clear text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import scenarios
from harness.engine.environment import DEFAULT_WORKER_CMD, Settings, SharedServices
from harness.engine.runner import Job, run_job
from harness.evidence.archive import MASK, mask
from harness.verdict import Verdict

TOKEN = re.compile(r"ct_[0-9a-f]{24}")


def test_mask_covers_values_not_only_keys() -> None:
    doc = {
        "note": "sent ct_0123456789abcdef01234567 with Bearer abcdefgh.ijkl",
        "nested": [{"harmless": "sk_live_ABCDEFGH12345678"}],
        "epoch_token": 3,
    }
    masked = mask(doc, secrets=["ct_0123456789abcdef01234567"])
    assert "ct_0123456789abcdef01234567" not in str(masked)
    assert "Bearer abcdefgh" not in str(masked) and "sk_live_" not in str(masked)
    assert masked["epoch_token"] == 3 and MASK in masked["note"]


@pytest.mark.slow
def test_experiment_archive_and_logs_hold_no_plaintext_secret(tmp_path: Path) -> None:
    module = next(m for m in scenarios.all_modules() if m.SPEC.id == "I")
    with SharedServices(Settings(worker_cmd=DEFAULT_WORKER_CMD)) as shared:
        auth = shared.backend.auth
        assert auth is not None  # the local backend's servers ask for the run's secret
        result = run_job(shared, Job(module, None, 0), report_dir=tmp_path / "report", seed=1)
    password = re.compile(re.escape(auth.password))
    assert result.verdict is Verdict.PASS, result.reason
    assert result.archive_path is not None
    archive = result.archive_path.read_text()
    assert MASK in archive  # the token was there to be masked (the tool received it)
    leaks = {
        str(p): TOKEN.findall(text) + password.findall(text)
        for p in (tmp_path / "report").rglob("*")
        if p.is_file() and (text := p.read_text(errors="replace"))
    }
    assert not {k: v for k, v in leaks.items() if v}, leaks

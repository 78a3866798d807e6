"""What the harness benchmark keeps of a run that did not pass."""

from __future__ import annotations

from pathlib import Path

from harness.engine.bench_harness import _kept


def test_a_run_that_did_not_pass_keeps_its_archive_and_its_workers_logs(tmp_path: Path) -> None:
    run = tmp_path / "tmp-reports" / "round 8 (+6 hogs)" / "20261206T015804Z-e0f11b"
    archive = run / "archives" / "F-reconciler_after_cancel.yaml"
    logs = run / "logs" / "F-reconciler_after_cancel"
    archive.parent.mkdir(parents=True)
    logs.mkdir(parents=True)
    archive.write_text("verdict: fail\n")
    (logs / "worker-R.stderr.log").write_text("the cause\n")
    keep = tmp_path / "kept"
    where = _kept({"archive": str(archive)}, "round 8 (+6 hogs)", keep)
    kept = keep / "round_8_+6_hogs"
    assert where == f" [{kept / archive.name}]"
    assert (kept / archive.name).read_text() == "verdict: fail\n"
    assert (kept / "F-reconciler_after_cancel-logs" / "worker-R.stderr.log").read_text() == (
        "the cause\n"
    )
    assert _kept({"archive": str(archive)}, "round 8", None) == ""

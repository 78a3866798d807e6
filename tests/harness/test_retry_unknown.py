"""An experiment that ends unknown runs again (runner.again_while_unknown):
it proved nothing, so another attempt hides nothing; a fail never runs
again; every earlier attempt's evidence is kept beside the run's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from harness.engine.runner import again_while_unknown
from harness.evidence.summary import ATTEMPTS_DIR, ExperimentResult
from harness.verdict import Verdict


def _attempts(
    tmp_path: Path, verdicts: list[Verdict]
) -> tuple[Callable[[], ExperimentResult], list[int]]:
    """An attempt that writes its archive and logs where run_job does and ends
    with the next verdict; the list counts the calls."""
    calls: list[int] = []
    left: Iterator[Verdict] = iter(verdicts)

    def attempt() -> ExperimentResult:
        calls.append(1)
        archive = tmp_path / "archives" / "W-x.yaml"
        archive.parent.mkdir(parents=True, exist_ok=True)
        archive.write_text(f"attempt: {len(calls)}\n")
        (tmp_path / "logs" / "W-x").mkdir(parents=True, exist_ok=True)
        (tmp_path / "logs" / "W-x" / "A.log").write_text(f"attempt {len(calls)}\n")
        verdict = next(left)
        return ExperimentResult(
            "W", "t", "x", 0, verdict, f"{verdict.value} {len(calls)}", 1.0, 0.0, archive, "-"
        )

    return attempt, calls


def test_an_unknown_runs_again_and_keeps_the_first_attempts_evidence(tmp_path: Path) -> None:
    attempt, calls = _attempts(tmp_path, [Verdict.UNKNOWN, Verdict.PASS])
    result = again_while_unknown(attempt, "W-x", tmp_path, retries=1)
    assert len(calls) == 2 and result.verdict is Verdict.PASS
    kept = tmp_path / ATTEMPTS_DIR / "W-x"
    assert (kept / "attempt-1.yaml").read_text() == "attempt: 1\n"
    assert (kept / "attempt-1-logs" / "A.log").read_text() == "attempt 1\n"
    assert (tmp_path / "archives" / "W-x.yaml").read_text() == "attempt: 2\n"
    assert result.earlier_attempts == [
        f"attempt 1: unknown: unknown 1 (evidence {ATTEMPTS_DIR}/W-x/attempt-1.yaml)"
    ]
    assert "attempt 2" in result.reason and f"{ATTEMPTS_DIR}/W-x/" in result.reason


def test_a_fail_never_runs_again(tmp_path: Path) -> None:
    attempt, calls = _attempts(tmp_path, [Verdict.FAIL, Verdict.PASS])
    result = again_while_unknown(attempt, "W-x", tmp_path, retries=3)
    assert len(calls) == 1 and result.verdict is Verdict.FAIL
    assert result.earlier_attempts == [] and not (tmp_path / ATTEMPTS_DIR).exists()


def test_retries_are_bounded_and_the_last_unknown_stands(tmp_path: Path) -> None:
    attempt, calls = _attempts(tmp_path, [Verdict.UNKNOWN] * 5)
    result = again_while_unknown(attempt, "W-x", tmp_path, retries=2)
    assert len(calls) == 3 and result.verdict is Verdict.UNKNOWN
    assert len(result.earlier_attempts) == 2
    assert sorted(p.name for p in (tmp_path / ATTEMPTS_DIR / "W-x").iterdir()) == [
        "attempt-1-logs", "attempt-1.yaml", "attempt-2-logs", "attempt-2.yaml",
    ]  # fmt: skip


def test_no_retries_is_one_attempt(tmp_path: Path) -> None:
    attempt, calls = _attempts(tmp_path, [Verdict.UNKNOWN, Verdict.PASS])
    assert again_while_unknown(attempt, "W-x", tmp_path, retries=0).verdict is Verdict.UNKNOWN
    assert len(calls) == 1

"""SIGINT, SIGTERM and SIGHUP stop a running matrix within the bound, leaving
reports marked interrupted and nothing else behind.

Each test starts the real CLI in a session of its own with a private TMPDIR,
waits from outside until the run is at a chosen point (setting up its
servers, a worker held at a barrier, a failover under way, the middle of a
`--repeat`), sends the signal as an operator would (Ctrl-C: SIGINT to the
terminal's whole process group; SIGTERM and SIGHUP: to the harness's pid),
and then checks from outside: exit status 128+signal within 5 s, reports
that say "interrupted" (never "environment error"), and no process, temp
directory, shared memory segment or /dev/shm file left behind.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.waiting import wait_for
from tests.harness import outside

pytestmark = pytest.mark.slow

STOP_BOUND_S = 5.0


def _at_setup(run: outside.Run) -> None:
    # initdb of the shared primary has begun: servers are being set up...
    run.wait_file("fencecheck-run-*/pg/primary/PG_VERSION")
    # ...and the watcher (sampling every 50 ms) has seen it, so that the
    # check below that a server was set up does not race the signal.
    wait_for(
        lambda: any(
            "initdb" in cmd or "postgres" in cmd for cmd in list(run.watcher.seen.pids.values())
        ),
        what="the watcher to see initdb of the shared primary",
        timeout_s=10,
    )


def _at_barrier(run: outside.Run) -> None:
    # D holds A at after_lease_row_locked while its lease runs out.
    run.wait_file("*/logs/D-*/A.events.jsonl", contains='"op":"save_checkpoint"')
    time.sleep(0.1)


def _at_failover(run: outside.Run) -> None:
    run.wait_file("fencecheck-run-*/H-*/pg/replica.log", contains="promote")


def _in_repeat(run: outside.Run) -> None:
    # The fourth of 20 repetitions started (three run at once): one is done,
    # more are queued.
    run.wait_line("A-r3: continuous checkpoints ...")


POINTS: dict[str, tuple[list[str], Callable[[outside.Run], None]]] = {
    "setup": (["run", "A"], _at_setup),
    "barrier": (["run", "D"], _at_barrier),
    "failover": (["run", "H"], _at_failover),
    "repeat": (["run", "A", "--repeat", "20"], _in_repeat),
}
# Ctrl-C reaches the terminal's whole foreground group; the others are aimed
# at the harness's pid (a CI runner's or container engine's stop, a hangup).
SIGNALS = {
    "SIGINT": (signal.SIGINT, True),
    "SIGTERM": (signal.SIGTERM, False),
    "SIGHUP": (signal.SIGHUP, False),
}


def _run_dir(reports: Path) -> Path:
    dirs = [p for p in reports.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.mark.parametrize("signame", list(SIGNALS))
@pytest.mark.parametrize("point", list(POINTS))
def test_signal_stops_the_run(point: str, signame: str, tmp_path: Path) -> None:
    args, wait_until = POINTS[point]
    sig, to_group = SIGNALS[signame]
    run = outside.start(args, tmp_path)
    try:
        wait_until(run)
        sent = run.signal(sig, group=to_group)
        code, ended, seen = run.finish()
    except BaseException:
        run.close()
        raise
    took = ended - sent
    assert code == 128 + sig, run.output
    assert took < STOP_BOUND_S, f"stopped in {took:.2f}s:\n{run.output}"
    print(f"{point} {signame}: exit {code} {took:.2f}s after the signal")
    try:
        assert outside.leftovers(seen, run.tmpdir) == [], run.output
    finally:
        run.close()
    assert any("initdb" in cmd or "postgres" in cmd for cmd in seen.pids.values()), (
        "no server was ever set up: the point was never reached"
    )
    run_dir = _run_dir(run.reports)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["run"]["status"] == "interrupted"
    assert results["run"]["interrupted"] == f"interrupted by {signame}"
    assert results["run"]["exit_code"] == code
    assert "INTERRUPTED" in (run_dir / "summary.md").read_text()
    assert 'name="status" value="interrupted"' in (run_dir / "junit.xml").read_text()
    cut = [r["reason"] for r in results["results"] if "interrupted" in r["reason"]]
    assert cut, "nothing was cut"
    assert all(r.startswith(f"interrupted by {signame}") for r in cut), cut
    assert not any("environment error" in r for r in cut), cut
    if point == "repeat":
        started = [r for r in results["results"] if "before it started" not in r["reason"]]
        assert len(started) < 10, "the repetitions went on after the signal"
    _check_part_and_seal(run_dir, f"interrupted by {signame}", run.output)


def _check_part_and_seal(run_dir: Path, why: str, output: str) -> None:
    """shard.json says the part was cut (merge lists it unfinished); an orderly
    stop seals the run directory last, and the seal holds."""
    from harness.evidence.manifest import MANIFEST_NAME, verify_report

    if (run_dir / "shard.json").is_file():  # none when the start itself was cut
        shard = json.loads((run_dir / "shard.json").read_text())
        assert shard["interrupted"] == why and shard["finished_at"] is None, shard
    if "killing everything" in output:
        return  # the stop escalated: no time for the seal, the reports say interrupted
    assert (run_dir / MANIFEST_NAME).is_file(), output
    check = verify_report(run_dir)
    assert check.intact, (check.changed, check.removed, check.added)


def test_second_signal_kills_everything_at_once(tmp_path: Path) -> None:
    run = outside.start(["run", "D"], tmp_path)
    try:
        _at_barrier(run)
        sent = run.signal(signal.SIGINT, group=True)
        time.sleep(0.05)
        run.signal(signal.SIGINT, group=True)
        code, ended, seen = run.finish()
    except BaseException:
        run.close()
        raise
    assert code == 130, run.output
    assert ended - sent < STOP_BOUND_S, run.output
    assert "second signal" in run.output
    try:
        assert outside.leftovers(seen, run.tmpdir) == [], run.output
    finally:
        run.close()
    results = json.loads((_run_dir(run.reports) / "results.json").read_text())
    assert results["run"]["status"] == "interrupted"


def test_sigterm_stops_a_named_mutants_campaign(tmp_path: Path) -> None:
    """The campaign's servers are shared by every mutant's template: a stop in
    the middle of a mutant's experiment leaves none of them behind, and the
    mutants not judged are listed as not run, never caught."""
    run = outside.start(["mutants", "lease_check_separate_tx", "write_ignores_epoch"], tmp_path)
    try:
        # A mutant's worker migrated its own template and an experiment's
        # worker is running on it.
        run.wait_file("mutants-*/*/logs/*-*/*.events.jsonl")
        sent = run.signal(signal.SIGTERM, group=False)
        code, ended, seen = run.finish()
    except BaseException:
        run.close()
        raise
    assert code == 128 + signal.SIGTERM, run.output
    assert ended - sent < STOP_BOUND_S, f"stopped in {ended - sent:.2f}s:\n{run.output}"
    try:
        assert outside.leftovers(seen, run.tmpdir) == [], run.output
    finally:
        run.close()
    run_dir = _run_dir(run.reports)
    entries = json.loads((run_dir / "mutants.json").read_text())
    assert {e["mutant"] for e in entries} == {"lease_check_separate_tx", "write_ignores_epoch"}
    assert all(not e["caught_by"] for e in entries if e.get("not_run")), entries
    assert any(e.get("not_run") for e in entries), "the stop cut nothing"
    _check_part_and_seal(run_dir, "interrupted by SIGTERM", run.output)


def test_ctrl_c_stops_a_generated_mutants_campaign(tmp_path: Path) -> None:
    """A Ctrl-C while a generated mutant's experiments run: every mutant not
    judged is "not run" (never an error, a survivor or an unconfirmed catch),
    the report is written, and nothing is left behind."""
    run = outside.start(
        ["mutants", "--auto", "*leases.py:Leases.*", "--no-baseline", "--jobs", "2"], tmp_path
    )
    try:
        run.wait_file("automutants-*/mutants/*/logs/*/*.events.jsonl")
        sent = run.signal(signal.SIGINT, group=True)
        code, ended, seen = run.finish()
    except BaseException:
        run.close()
        raise
    assert code == 130, run.output
    assert ended - sent < STOP_BOUND_S, f"stopped in {ended - sent:.2f}s:\n{run.output}"
    try:
        assert outside.leftovers(seen, run.tmpdir) == [], run.output
    finally:
        run.close()
    (journal,) = run.reports.glob("automutants-*/outcomes.jsonl")
    statuses = [json.loads(line)["status"] for line in journal.read_text().splitlines()]
    assert "not_run" in statuses, statuses
    assert not {"error", "unconfirmed"} & set(statuses), run.output


def test_a_signal_after_the_verdict_keeps_its_exit_code(tmp_path: Path) -> None:
    """Ctrl-C just after the last line said "exit 0": the process exits 0, not
    130 (or dead by SIGINT when the interpreter's shutdown had put the
    default handler back), and still leaves nothing behind."""
    run = outside.start(["run", "A", "--no-pages"], tmp_path)
    try:
        run.wait_line("fencecheck: exit 0:")
        run.signal(signal.SIGINT, group=True)
        code, _, seen = run.finish()
    except BaseException:
        run.close()
        raise
    try:
        assert code == 0, run.output
        assert outside.leftovers(seen, run.tmpdir) == [], run.output
    finally:
        run.close()

"""Measure how fast a run stops, per signal and point, and what reaping takes.

    python -m tests.harness.stop_times [--rounds N] [--backend containers] [--hogs K]

Starts real `fencecheck run`s with a private TMPDIR (as tests/harness/
test_interrupts.py does), signals each at four points (setting up its
servers, a worker held at a barrier, during H's failover, in the middle of a
`--repeat 20`) with SIGINT to its process group (a terminal's Ctrl-C),
SIGTERM and SIGHUP to its pid, and prints the time from the signal to the
exit, the worst per signal and per point, whether anything was left, and
whether the run wrote the archives of what it ran (an interrupted run must).
The point ``second`` is H's failover with a second SIGINT 0.3 s after the
first. ``--hogs K`` runs K CPU-bound processes beside every run (a loaded
machine). Then it SIGKILLs a run of H and prints what the next run's reaping
removed and how long it took. A benchmark prints figures; the tests assert
the bound.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.harness import outside
from tests.harness.test_interrupts import POINTS, SIGNALS


def _containers_setup(run: outside.Run) -> None:
    # The record exists: the containers of the shared services are starting.
    run.wait_file("fencecheck-state-*/run-*.json")
    time.sleep(1.0)


def _containers_failover(run: outside.Run) -> None:
    # H registers its intent right before it fences the primary and promotes.
    run.wait_file("*/logs/H-*/W.events.jsonl", contains='"op":"register_intent"')


# With containers the data directories live in the containers: other marks.
CONTAINER_POINTS = {
    **POINTS,
    "setup": (POINTS["setup"][0], _containers_setup),
    "failover": (POINTS["failover"][0], _containers_failover),
}


def _archives_written(reports: Path) -> int:
    return sum(1 for _ in reports.glob("*/archives/*.yaml"))


def _stop_once(point: str, signame: str, backend: str, tmp: Path) -> tuple[float, int, list[str]]:
    second = point == "second"
    args, wait_until = (CONTAINER_POINTS if backend == "containers" else POINTS)[
        "failover" if second else point
    ]
    sig, to_group = SIGNALS[signame]
    run = outside.start([*args, "--backend", backend], tmp)
    try:
        wait_until(run)
        sent = run.signal(sig, group=to_group)
        if second:
            time.sleep(0.3)
            run.signal(sig, group=to_group)
        code, ended, seen = run.finish()
        if point != "setup" and not _archives_written(run.reports):
            print(f"{point} {signame}: no archive written", file=sys.stderr)
        if code != 128 + sig:
            print(run.output[-3000:], file=sys.stderr)
        left = outside.leftovers(seen, run.tmpdir)
        if left and all(item.startswith("run record left") for item in left):
            # What the engine had not removed in time: the record names it.
            started = time.monotonic()
            reaped = _clean(run.tmpdir)
            left = [f"record kept; `clean` then: {reaped} ({time.monotonic() - started:.1f}s)"]
            left += outside.leftovers(seen, run.tmpdir)
        if point != "setup" and not _archives_written(run.reports):
            left = [*left, "no archive of what ran"]
        return ended - sent, code, left
    finally:
        run.close()


def _clean(tmpdir: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "clean"],
        cwd=outside.REPO,
        env={**os.environ, "TMPDIR": str(tmpdir)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = re.search(r"(\d+) container\(s\)/network\(s\)", done.stdout)
    return f"{found.group(1) if found else 0} container(s)/network(s) removed"


def _reap_once(backend: str, tmp: Path) -> str:
    run = outside.start(["run", "H", "--backend", backend], tmp)
    try:
        if backend == "local":
            run.wait_file("fencecheck-run-*/H-*/pg/replica/postmaster.pid", contains="ready")
        else:
            _containers_failover(run)
        run.signal(signal.SIGKILL)
        run.finish()
        done = subprocess.run(
            [sys.executable, "-m", "harness.cli", "clean"],
            cwd=outside.REPO,
            env={**os.environ, "TMPDIR": str(run.tmpdir)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        return "\n".join(line for line in done.stdout.splitlines() if "reaped" in line)
    finally:
        run.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.stop_times")
    parser.add_argument("--rounds", type=int, default=1, help="runs per signal and point")
    parser.add_argument("--backend", choices=("local", "containers"), default="local")
    parser.add_argument("--hogs", type=int, default=0, help="CPU-bound processes beside")
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        return _measure(args)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _measure(args: argparse.Namespace) -> int:
    load = os.getloadavg()
    print(
        f"backend {args.backend}, {args.rounds} round(s), {args.hogs} CPU hog(s), "
        f"load average {load[0]:.1f}"
    )
    print(f"{'point':<10} {'signal':<8} {'exit':>5} {'stop s':>7}  leftovers")
    worst: dict[str, float] = {}
    worst_point: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="fencecheck-stop-times-") as scratch:
        for _round in range(args.rounds):
            for point in [*POINTS, "second"]:
                for signame in SIGNALS if point != "second" else ["SIGINT"]:
                    here = Path(tempfile.mkdtemp(dir=scratch))  # its own reports directory
                    took, code, left = _stop_once(point, signame, args.backend, here)
                    worst[signame] = max(worst.get(signame, 0.0), took)
                    worst_point[point] = max(worst_point.get(point, 0.0), took)
                    if code != 128 + SIGNALS[signame][0]:
                        left = [*left, f"unexpected exit {code}"]
                    print(
                        f"{point:<10} {signame:<8} {code:>5} {took:>7.2f}  "
                        f"{'none' if not left else '; '.join(left)}",
                        flush=True,
                    )
        print("worst per signal: " + ", ".join(f"{s} {t:.2f}s" for s, t in worst.items()))
        print("worst per point: " + ", ".join(f"{p} {t:.2f}s" for p, t in worst_point.items()))
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
        reaped = _reap_once(args.backend, Path(tempfile.mkdtemp(dir=scratch)))
        print("after SIGKILL of `run H`, `fencecheck clean`:")
        print(re.sub(r"(?m)^", "  ", reaped or "(nothing reaped)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

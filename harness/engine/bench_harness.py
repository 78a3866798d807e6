"""The harness's own overhead, printed (never asserted): ``make bench-harness``.

    python -m harness.engine.bench_harness [--rounds N] [--jobs J] [--hogs K]
        [--exec-too] [--keep-reports] [-- RUN-ARGS...]

Runs the real ``fencecheck run`` (the whole matrix unless RUN-ARGS name
experiments) ``--rounds`` times, one after the other, and prints per round:
the wall time, the CPU time of the run and everything it started, the load
average before and after, the verdicts, and where the experiment runs' time
went (the phases each run records, harness/engine/phases.py). The harness's
overhead per experiment run is the sum of their wall times minus the waits
their protocol timers impose (each spec's ``natural_wait_s``), divided by
their number: what the harness itself costs, whatever the parallelism.

``--hogs K`` starts K CPU-bound processes beside every round (the soundness
check of a loaded machine: a correct worker must get no FAIL); ``--exec-too``
adds a round with FENCECHECK_FORK_SERVER=0, so the fork server's share shows
as a ratio taken in one run of the benchmark. The archive of every run that
did not pass is copied to reports/bench-harness-<time>/ (its evidence must
outlive the benchmark's temporary reports) and named with its verdict.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.cli.run import RUN_JOBS

# CPU-bound, and gone once the benchmark is: a hog whose parent died (killed
# with SIGKILL, say) sees another parent pid and ends by itself.
HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"
# How long an interrupted round's `fencecheck run` gets for its orderly stop
# (it promises 5 s) before it is killed.
RUN_STOP_S = 10.0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_round(
    label: str,
    run_args: list[str],
    jobs: int,
    env: dict[str, str],
    report_root: Path,
    keep_dir: Path | None = None,
) -> dict[str, Any]:
    """One ``fencecheck run``: its figures, from its own results.json."""
    report_dir = report_root / label
    cmd = [sys.executable, "-m", "harness.cli", "run", "--quiet", "--jobs", str(jobs)]
    cmd += ["--report-dir", str(report_dir), *run_args]
    load_before = _load()
    cpu_before = _children_cpu()
    started = time.monotonic()
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = run.communicate()
    except BaseException:
        # Interrupted: the run stops in order (its clusters, proxies and temp
        # directories go with it), killed only if it overstays.
        run.terminate()
        try:
            run.wait(timeout=RUN_STOP_S)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
        raise
    done = subprocess.CompletedProcess(cmd, run.returncode, out, err)
    wall = time.monotonic() - started
    cpu = _children_cpu() - cpu_before
    results_path = next(report_dir.glob("*/results.json"), None)
    if results_path is None:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise SystemExit(f"{label}: no results.json (exit {done.returncode}): {' | '.join(tail)}")
    document = json.loads(results_path.read_text())
    results = document["results"]
    phases: collections.Counter[str] = collections.Counter()
    for r in results:
        phases.update(r.get("phases_s") or {})
    verdicts = collections.Counter(r["verdict"] for r in results)
    summed = sum(r["duration_s"] for r in results)
    natural = sum(r["natural_wait_s"] for r in results)
    return {
        "label": label,
        "exit": done.returncode,
        "wall_s": wall,
        "cpu_s": cpu,
        "load_before": load_before,
        "load_after": _load(),
        "runs": len(results),
        "verdicts": dict(verdicts),
        "summed_s": summed,
        "natural_s": natural,
        "overhead_per_run_s": (summed - natural) / max(1, len(results)),
        "phases": dict(phases),
        "wait_log": document.get("run", {}).get("wait_log") or {},
        "not_pass": [
            f"{r['experiment']}{'[' + r['variant'] + ']' if r['variant'] else ''}: "
            f"{r['verdict']}: {r['reason'][:160]}" + _kept(r, label, keep_dir)
            for r in results
            if r["verdict"] != "pass"
        ],
        # Runs that ended unknown and ran again (fencecheck run --retry-unknown).
        "again": [
            f"{r['experiment']}{'[' + r['variant'] + ']' if r['variant'] else ''}: "
            f"{r['verdict']} after {a[:160]}"
            for r in results
            for a in r.get("earlier_attempts") or []
        ],
    }


def _kept(result: dict[str, Any], label: str, keep_dir: Path | None) -> str:
    """Copy a run's archive, and its workers' logs beside it, out of the
    temporary reports; where the archive went. The logs are what tells a
    worker's own failure from the machine's: a Go ops worker that exited 1
    at once, in a loaded round, left its cause only there, and they went
    with the temporary reports."""
    source = Path(str(result.get("archive") or ""))
    if keep_dir is None or not source.is_file():
        return ""
    target = keep_dir / label.replace(" ", "_").replace("(", "").replace(")", "") / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)
    logs = source.parent.parent / "logs" / source.stem
    if logs.is_dir():
        shutil.copytree(logs, target.parent / f"{source.stem}-logs", dirs_exist_ok=True)
    return f" [{target}]"


def report(rounds: list[dict[str, Any]]) -> str:
    lines = []
    for r in rounds:
        verdicts = ", ".join(f"{v} {n}" for v, n in sorted(r["verdicts"].items()))
        lines.append(
            f"{r['label']}: exit {r['exit']}, wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s "
            f"({r['cpu_s'] / r['wall_s']:.2f} cores), load {r['load_before']} -> "
            f"{r['load_after']}; {r['runs']} runs ({verdicts}); summed {r['summed_s']:.1f} s, "
            f"natural waits {r['natural_s']:.1f} s, overhead {r['overhead_per_run_s']:.2f} s/run"
        )
        if r["wait_log"]:
            lines.append(
                f"    wait log: at most {r['wait_log']['peak_waits']} waits kept at once"
                f" (about {r['wait_log']['peak_mib']:.2f} MiB)"
            )
        lines.extend(f"    not pass: {line}" for line in r["not_pass"])
        lines.extend(f"    ran again: {line}" for line in r["again"])
    first = rounds[0]
    lines.append(f"\nwhere the runs' time went ({first['label']}; seconds, summed over runs):")
    n = max(1, first["runs"])
    for name, spent in sorted(first["phases"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:32s} {spent:8.1f}  {spent / n:6.2f} per run")
    if len(rounds) > 1:
        base = rounds[0]
        for other in rounds[1:]:
            lines.append(
                f"ratio {other['label']} / {base['label']}: wall "
                f"{other['wall_s'] / base['wall_s']:.2f}, CPU {other['cpu_s'] / base['cpu_s']:.2f}, "
                f"overhead per run {other['overhead_per_run_s'] / base['overhead_per_run_s']:.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.engine.bench_harness")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--jobs",
        type=int,
        default=int(os.environ.get("JOBS", "0")) or RUN_JOBS,
        help=f"experiments at once (default {RUN_JOBS}, as `fencecheck run`)",
    )
    parser.add_argument("--hogs", type=int, default=0, help="CPU-bound processes beside the run")
    parser.add_argument(
        "--exec-too", action="store_true", help="one more round with exec'd workers"
    )
    parser.add_argument("--keep-reports", action="store_true")
    parser.add_argument("run_args", nargs="*", help="passed to `fencecheck run` (after --)")
    args = parser.parse_args(argv)
    # SIGTERM and SIGHUP end the benchmark like Ctrl-C: through the cleanup
    # below (the round's run stopped, the hogs killed, the reports removed).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    hogs = [
        subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL)
        for _ in range(args.hogs)
    ]
    report_root = Path(tempfile.mkdtemp(prefix="fencecheck-bench-harness-"))
    keep_dir = Path("reports") / time.strftime("bench-harness-%Y%m%dT%H%M%S")
    rounds: list[dict[str, Any]] = []
    try:
        env = dict(os.environ)
        for n in range(args.rounds):
            label = f"round {n + 1}" + (f" (+{args.hogs} hogs)" if args.hogs else "")
            rounds.append(one_round(label, args.run_args, args.jobs, env, report_root, keep_dir))
            # The round's line and its runs that did not pass (not the phases).
            print(report(rounds[-1:]).split("\n\n")[0], flush=True)
        if args.exec_too:
            env = {**env, "FENCECHECK_FORK_SERVER": "0"}
            rounds.append(
                one_round("exec'd workers", args.run_args, args.jobs, env, report_root, keep_dir)
            )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        if not args.keep_reports:
            subprocess.run(["rm", "-rf", str(report_root)], check=False)
    print()
    print(report(rounds))
    if args.keep_reports:
        print(f"reports kept in {report_root}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(
            "bench-harness: interrupted; its run stopped, hogs and reports removed", file=sys.stderr
        )
        sys.exit(130)

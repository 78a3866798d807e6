"""``fencecheck mutants``: prove that the matrix catches every protocol mutant.

A check that cannot fail proves nothing. The reference worker lists its
mutants (``<worker-cmd> mutants`` prints JSON: name, rule, catchers,
description); each breaks exactly one protocol rule. For each mutant the
harness runs the experiments expected to catch it, against a worker started
with that mutant (``FENCECHECK_MUTANT``), and if none fails, the rest of the
matrix. A mutant no experiment fails is a failure of the harness itself.
One catch is enough: the expected catchers run the quickest first and none
starts after the first fail (``every_catcher`` runs them all, to see every
experiment that catches it).

Only a *fail* verdict counts as caught: an *unknown* (fault not confirmed)
proves nothing about the mutant. And a fail counts only when it is
*confirmed*: a catching experiment, rerun at once against the unmutated
implementation (up for the whole campaign), passes (as ``mutants --auto``
confirms: one is enough, the quickest first). A catch none of them passes
(a loaded machine, a flaky experiment, a mutant whose code never ran) is
reported unconfirmed and is no catch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import scenarios
from harness import stopping
from harness.engine import job_order
from harness.engine.environment import Settings, SharedServices
from harness.engine.progress import Progress
from harness.engine.runner import jobs_for, run_jobs, run_jobs_until_fail
from harness.engine.shards import Shard, job_cost
from harness.evidence.gate import mutants_gate
from harness.evidence.shard_record import named_items, new_record, write_record
from harness.evidence.summary import ExperimentResult
from harness.parts.pg_binaries import find_pg_binaries
from harness.verdict import Verdict

#: As `fencecheck run` and `mutants --auto`: a run against a mutant that ended
#: unknown (it proved nothing: a fault a loaded machine kept from taking
#: effect) runs once more; a fail never does. Without it a catcher whose fault
#: missed once left its mutant "not caught" (seen in CI: H[sync_cancelled_wait]
#: never saw its COMMIT wait for the standby under load).
RETRY_UNKNOWN = 1


class MutantListUnavailable(RuntimeError):
    """The worker command cannot list its mutants."""


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    rule: int
    catchers: tuple[str, ...]
    description: str
    alters: str = ""  # the one place it changes, e.g. "SQL overlay x.sql (fencecheck.renew)"


@dataclasses.dataclass
class MutantOutcome:
    mutant: Mutant
    caught_by: list[str]
    expected_caught: bool
    detail: str
    wall_s: float
    results: list[ExperimentResult]
    # Why the catch does not count (its experiments did not pass unmutated).
    unconfirmed: str = ""

    @property
    def caught(self) -> bool:
        return bool(self.caught_by) and not self.unconfirmed


class Confirmation:
    """The campaign's servers with the unmutated template, up for the whole
    campaign: every mutant runs on a template of its own beside it
    (:func:`check_mutant`), and every catch is rerun here: a fail counts only
    if a catching experiment passes against the unmutated implementation."""

    def __init__(self, settings: Settings, report_dir: Path, *, seed: int) -> None:
        self.settings = dataclasses.replace(settings, mutant=None, keep=False)
        self.report_dir = report_dir
        self.seed = seed
        self._stack = contextlib.ExitStack()
        self.shared: SharedServices | None = None

    def __enter__(self) -> Confirmation:
        self.shared = self._stack.enter_context(SharedServices(self.settings))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def confirm(self, outcome: MutantOutcome, attempts: int = 2) -> None:
        """Rerun a catching experiment unmutated, as ``mutants --auto`` does: one
        that passes there is enough, the quickest (by its run against the
        mutant) first, since catchers that failed side by side all count and
        each rerun costs its whole wall time. An unknown there (a fault that did
        not take effect) is retried, up to ``attempts`` runs each; a fail there
        moves on to the next catcher."""
        assert self.shared is not None
        caught = sorted(
            (r for r in outcome.results if r.verdict is Verdict.FAIL), key=lambda r: r.duration_s
        )
        all_jobs = jobs_for(scenarios.all_modules(), 1)
        bad: list[ExperimentResult] = []
        runs = 0
        for failed in caught:
            job = [j for j in all_jobs if j.label == failed.label]
            if not job:  # never trivially confirmed: nothing ran
                continue
            results: list[ExperimentResult] = []
            for _ in range(attempts):
                if stopping.requested():
                    return
                runs += 1
                results = run_jobs(
                    self.shared,
                    job,
                    report_dir=self.report_dir / "confirm" / outcome.mutant.name / str(runs),
                    seed=self.seed,
                    parallel=1,
                )
                if all(r.verdict is Verdict.PASS for r in results):
                    outcome.detail += (
                        f" (confirmed: {failed.label} passes against the unmutated implementation)"
                    )
                    return
                if any(r.verdict is Verdict.FAIL for r in results):
                    break
            bad.extend(r for r in results if r.verdict is not Verdict.PASS)
        outcome.unconfirmed = (
            "; ".join(
                f"{r.name} gave {r.verdict.value} against the unmutated implementation too "
                f"({r.reason[:120]})"
                for r in bad
            )
            or "no catching experiment could be rerun"
        )
        outcome.detail = f"UNCONFIRMED: {outcome.unconfirmed}; the mutant's own: {outcome.detail}"


def list_mutants(worker_cmd: Sequence[str]) -> list[Mutant]:
    """The worker's mutants, from ``<worker-cmd> mutants`` (JSON on stdout)."""
    try:
        proc = subprocess.run(
            [*worker_cmd, "mutants"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as exc:
        raise MutantListUnavailable(f"cannot run `{' '.join(worker_cmd)} mutants`: {exc}") from exc
    if proc.returncode != 0:
        raise MutantListUnavailable(
            f"`{' '.join(worker_cmd)} mutants` exited {proc.returncode}: "
            f"{proc.stderr.strip()[-500:]} (only the reference worker has mutants)"
        )
    try:
        raw: list[dict[str, Any]] = json.loads(proc.stdout)
        return [
            Mutant(
                name=str(m["name"]),
                rule=int(m["rule"]),
                catchers=tuple(str(c).upper() for c in m["catchers"]),
                description=str(m.get("description", "")),
                alters=str(m.get("alters", "")),
            )
            for m in raw
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise MutantListUnavailable(
            f"`mutants` printed something that is not the list: {exc}"
        ) from exc


def _failed(results: Sequence[ExperimentResult]) -> list[ExperimentResult]:
    return [r for r in results if r.verdict is Verdict.FAIL]


def check_mutant(
    mutant: Mutant,
    base: SharedServices,
    report_dir: Path,
    *,
    parallel: int,
    seed: int,
    every_catcher: bool = False,
) -> MutantOutcome:
    """Run ``mutant`` against its catchers, then (if uncaught) the rest of the
    matrix: on the campaign's servers (``base``), with a template database the
    mutant's worker migrated (its SQL overlays), dropped when it is done.

    The catchers run the quickest expected first and none starts after a fail
    (those running finish and count); ``every_catcher`` runs each of them
    (a W mutant's fourteen catchers took 85 s where its quickest took 13)."""
    started = time.monotonic()
    settings = dataclasses.replace(base.settings, mutant=mutant.name, keep=False)
    all_modules = scenarios.all_modules()
    expected = [m for m in all_modules if m.SPEC.id in mutant.catchers]
    rest = [m for m in all_modules if m.SPEC.id not in mutant.catchers]
    results: list[ExperimentResult] = []
    own = report_dir / mutant.name
    with base.worker_view(settings, f"fc_mutant_{mutant.name}"[:63], own / "logs") as shared:
        catchers = jobs_for(expected, 1)
        if every_catcher:
            results += run_jobs(
                shared, catchers, report_dir=own, seed=seed, parallel=parallel,
                retry_unknown=RETRY_UNKNOWN,
            )  # fmt: skip
        else:
            known = job_order.expected_durations()  # read once, not per catcher
            results += run_jobs_until_fail(
                shared, sorted(catchers, key=lambda j: job_order.expected_seconds(j, known)),
                report_dir=own, seed=seed, parallel=parallel, stop=stopping.requested,
                retry_unknown=RETRY_UNKNOWN,
            )  # fmt: skip
        expected_caught = bool(_failed(results))
        if not expected_caught and not stopping.requested():
            results += run_jobs(
                shared, jobs_for(rest, 1), report_dir=own, seed=seed, parallel=parallel,
                retry_unknown=RETRY_UNKNOWN,
            )  # fmt: skip
    failed = _failed(results)
    detail = (
        "; ".join(f"{r.name}: {r.reason}" for r in failed)
        if failed
        else "no experiment failed: " + ", ".join(f"{r.name}={r.verdict.value}" for r in results)
    )
    return MutantOutcome(
        mutant=mutant,
        caught_by=sorted({r.name for r in failed}),
        expected_caught=expected_caught,
        detail=detail,
        wall_s=time.monotonic() - started,
        results=results,
    )


def table(outcomes: Sequence[MutantOutcome]) -> str:
    rows = [("mutant", "rule", "expected", "caught by", "verdict detail")]
    for o in outcomes:
        rows.append(
            (
                o.mutant.name,
                str(o.mutant.rule),
                ",".join(o.mutant.catchers),
                ",".join(o.caught_by)
                if o.caught
                else ("UNCONFIRMED" if o.caught_by else "NOT CAUGHT"),
                o.detail[:90],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join([*(r[i].ljust(widths[i]) for i in range(4)), r[4]]) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def run_mutants(
    settings: Settings,
    names: Sequence[str],
    *,
    report_root: Path,
    parallel: int,
    seed: int = 20261129,
    concurrent_mutants: int = 2,
    shard: Shard | None = None,
    fail_on: str = "fail",
    run_pages: bool = True,
    every_catcher: bool = False,
) -> int:
    """The CLI's ``mutants`` command; exit 0 only when every mutant was caught
    (``every_catcher``: see :func:`check_mutant`).

    With ``shard`` K/N only part K of the mutant list runs (the split of
    :mod:`harness.engine.shards`, by the expected cost of each mutant's
    catchers); the report directory's shard.json lets ``fencecheck merge``
    put the parts together. ShardError (a ValueError) when N parts cannot be made.

    A stop request ends it within seconds: no further mutant starts, the
    running ones' experiments are aborted, every mutant not checked is listed
    in ``mutants.json`` as not run (never caught), shard.json says what cut
    the run, and it returns the stop's exit status.

    ``run_pages`` False leaves each mutant's run pages out (the index links to
    how to build them): a score in CI need not render a few hundred pages.
    """
    known = list_mutants(settings.worker_cmd)
    by_name = {m.name: m for m in known}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown mutant(s) {unknown}; known: {', '.join(sorted(by_name))}")
    chosen = [by_name[n] for n in names] if names else known
    shard = shard or Shard(1, 1)
    items = named_items({m.name: _catchers_cost(m) for m in chosen}, shard.count)
    mine = {i.label for i in items if i.shard == shard.index}
    chosen = [m for m in chosen if m.name in mine]
    report_dir = report_root / (
        "mutants-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    )
    report_dir.mkdir(parents=True, exist_ok=True)
    record = new_record(
        kind="mutants",
        run_id=report_dir.name,
        shard=shard,
        items=items,
        seed=seed,
        worker_cmd=settings.worker_cmd,
        mutant=None,
        postgres_version=find_pg_binaries(settings.pg_bin).version,
        backend=settings.backend,
    )
    write_record(report_dir, record)
    started = time.monotonic()
    out = Progress(quiet=True)
    part = f", part {shard} of {len(items)}" if shard.count > 1 else ""
    out.say(f"fencecheck mutants: {len(chosen)} mutant(s){part}; reports in {report_dir}")

    confirmation = Confirmation(settings, report_dir, seed=seed)

    def one(m: Mutant) -> MutantOutcome | None:
        if stopping.requested():
            return None
        try:
            assert confirmation.shared is not None
            outcome = check_mutant(
                m, confirmation.shared, report_dir, parallel=parallel, seed=seed,
                every_catcher=every_catcher,
            )  # fmt: skip
            if outcome.caught_by:
                confirmation.confirm(outcome)
        except stopping.Interrupted:
            return None
        if stopping.requested():
            return None  # its experiments were cut: it proves nothing either way
        if outcome.caught:
            mark = "caught by " + ",".join(outcome.caught_by) + " (confirmed)"
        elif outcome.caught_by:
            mark = f"UNCONFIRMED catch by {','.join(outcome.caught_by)}: {outcome.unconfirmed}"
        else:
            mark = "NOT CAUGHT"
        out.say(f"  {m.name} (rule {m.rule}): {mark} in {outcome.wall_s:.1f}s")
        return outcome

    pool = ThreadPoolExecutor(max_workers=concurrent_mutants, thread_name_prefix="mutant")
    try:
        with confirmation:
            futures = [pool.submit(one, m) for m in chosen]
            while not all(f.done() for f in futures) and not stopping.wait(0.2):
                pass
    except stopping.Interrupted:
        futures = []
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if stopping.requested():
        # The running mutants' experiments were aborted by the stop itself;
        # give their teardown the run's grace, then report.
        deadline = time.monotonic() + 2.0
        for f in futures:
            with contextlib.suppress(Exception):
                f.result(timeout=max(0.0, deadline - time.monotonic()))
    outcomes: list[MutantOutcome] = []
    for f in futures:
        if not f.done() or f.cancelled():
            continue
        error = f.exception()
        if error is not None:
            raise error
        outcome = f.result()
        if outcome is not None:
            outcomes.append(outcome)
    wall = time.monotonic() - started
    caught = sum(o.caught for o in outcomes)
    interrupted = stopping.reason() if stopping.requested() else None
    out.say("")
    out.say(table(outcomes))
    out.say(
        f"\nmutation score: {caught}/{len(outcomes)} caught in {wall:.1f}s"
        f" ({sum(o.expected_caught and o.caught for o in outcomes)} by their expected experiment"
        f", {sum(bool(o.unconfirmed) for o in outcomes)} unconfirmed)"
        + (
            f"; INTERRUPTED ({interrupted}): {len(chosen) - len(outcomes)} not checked"
            if interrupted
            else ""
        )
    )
    entries: list[dict[str, Any]] = [
        {
            "mutant": o.mutant.name,
            "rule": o.mutant.rule,
            "expected": list(o.mutant.catchers),
            "caught_by": o.caught_by if o.caught else [],
            "unconfirmed_catch_by": o.caught_by if o.unconfirmed else [],
            "expected_caught": o.expected_caught and o.caught,
            "detail": o.detail,
            "wall_s": round(o.wall_s, 2),
        }
        for o in outcomes
    ]
    checked = {o.mutant.name for o in outcomes}
    entries += [
        {
            "mutant": m.name,
            "rule": m.rule,
            "expected": list(m.catchers),
            "caught_by": [],
            "expected_caught": False,
            "detail": f"not checked: {interrupted}",
            "not_run": True,
        }
        for m in chosen
        if m.name not in checked
    ]
    (report_dir / "mutants.json").write_text(json.dumps(entries, indent=2))
    if interrupted:
        write_record(report_dir, record.cut(interrupted, wall))
        _publish(report_dir, out, pages=False)
        return stopping.exit_status()
    write_record(report_dir, record.finished(wall))
    _publish(report_dir, out, pages=True, run_pages=run_pages)
    code, last_line = mutants_gate(entries, fail_on)
    out.say(last_line)
    return code


def _publish(report_dir: Path, out: Progress, *, pages: bool, run_pages: bool = True) -> None:
    """Pages for every mutant's runs (unless ``run_pages`` is False) and the
    folder's index, then the seal (last). A stopped run seals without pages
    (no time: `fencecheck report` builds them)."""
    from harness.evidence.html.mutants import write_mutants_pages
    from harness.evidence.manifest import run_digest, write_manifest

    try:
        if not pages:
            out.say(f"pages NOT WRITTEN (stopped; rebuild: fencecheck report {report_dir})")
        else:
            out.say(f"pages: {write_mutants_pages(report_dir, run_pages=run_pages)}")
    except Exception as exc:  # the score stands on mutants.json; say why pages are missing
        out.say(f"pages NOT WRITTEN ({type(exc).__name__}: {exc})")
    write_manifest(report_dir)
    out.say(f"evidence digest {run_digest(report_dir)} (fencecheck verify {report_dir})")


def _catchers_cost(mutant: Mutant) -> float:
    """Expected seconds of running a mutant's catchers (for balancing parts)."""
    modules = [m for m in scenarios.all_modules() if m.SPEC.id in mutant.catchers]
    return sum(job_cost(j) for j in jobs_for(modules, 1))

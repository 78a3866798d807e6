"""``fencecheck mutants [NAMES]``: prove the matrix catches protocol mutants.

Without ``--auto``: the reference worker's named mutants, each against its
expected catchers, then the rest of the matrix (``harness.mutation.named``).

With ``--auto``: mutants generated mechanically from the reference
implementation's SQL and Python (``harness.mutation.catalog``), each run
until its first fail, and the mutation score (``harness.mutation.auto``).
Exit 0 when the score reaches ``--min-score``, 1 below it, 2 when no mutant
could be judged or the unmutated implementation does not pass.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import stopping
from harness.cli.common import (
    REPO_ROOT,
    UsageError,
    common_env_options,
    positive,
    reap_and_report,
    settings_from_args,
    shard_from_args,
    shard_option,
)
from harness.cli.explore import duration
from harness.evidence.gate import add_gate_option
from harness.verdict import EXIT_UNKNOWN

if TYPE_CHECKING:
    from harness.engine.environment import Settings
    from harness.mutation.named import Mutant

NAME = "mutants"
HELP = "prove the matrix catches protocol mutants (named ones, or --auto: generated ones)"
TRIAGE_FILE = REPO_ROOT / "reference_impl" / "mutants" / "equivalent.yaml"
LEARNED_FILE = "automutants-learned.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "names",
        nargs="*",
        help="named mutants (all when omitted); with --auto: generated mutant ids or "
        "shell-style patterns such as '*fencecheck.renew*'",
    )
    parser.add_argument("--report-dir", default=str(REPO_ROOT / "reports"))
    parser.add_argument(
        "--explore",
        action="store_true",
        help="instead of the matrix, run an exploration campaign per mutant (docs/explore.md) "
        "and print found or not, schedules and seconds to the first violation, shrunk size",
    )
    parser.add_argument(
        "--shrink-budget",
        type=duration,
        default=60.0,
        help="with --explore: shrink budget per found mutant (default 1m)",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="list the selected mutants (named, or generated with --auto), run nothing",
    )
    parser.add_argument(
        "--no-pages",
        action="store_true",
        help="write no HTML pages for each mutant's runs (the index and mutants.json, or "
        "with --auto results.json and summary.md, are always written; `fencecheck report "
        "DIR` builds the pages later)",
    )
    parser.add_argument(
        "--every-catcher",
        action="store_true",
        help="named mutants: run every expected catcher of each mutant (by default they run "
        "the quickest first and none starts after the first fail: one catch is enough)",
    )
    shard_option(parser, "mutants")
    add_gate_option(parser)
    common_env_options(parser)
    parser.set_defaults(jobs=None)  # named: 3; --auto: 4 (per mutant)
    auto = parser.add_argument_group("generated mutants (--auto)")
    auto.add_argument(
        "--auto",
        action="store_true",
        help="mutants generated from the reference implementation's SQL and Python",
    )
    auto.add_argument(
        "--diff", action="store_true", help="print the selected mutants' diffs, run nothing"
    )
    auto.add_argument("--sample", type=positive, help="a seeded random sample of N mutants")
    auto.add_argument(
        "--seed",
        type=int,
        help="--auto: the sample's seed (default 0); --explore: the Hypothesis seed (default 1)",
    )
    auto.add_argument("--language", choices=("sql", "python"), help="only SQL or only Python")
    auto.add_argument(
        "--budget",
        type=duration,
        help="--auto: after this long (600, 30m, 2h) start no mutant and no experiment; "
        "mutants left or cut short are 'not run' (never survived); --explore: the search "
        "budget per mutant (default 5m)",
    )
    auto.add_argument(
        "--mutants-at-once",
        type=positive,
        default=1,
        help="mutants run at the same time (default 1; each runs --jobs experiments at once)",
    )
    auto.add_argument(
        "--triage",
        default=str(TRIAGE_FILE),
        help="equivalent / analysed-survivor file (default reference_impl/mutants/equivalent.yaml)",
    )
    auto.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the first run of the unmutated implementation (its pass is what makes a "
        "catch mean something)",
    )
    auto.add_argument(
        "--no-confirm",
        action="store_true",
        help="count a catch without rerunning its experiment against the unmutated "
        "implementation (by default a catch that experiment also fails there is "
        "'unconfirmed', not caught)",
    )
    auto.add_argument(
        "--run-equivalent", action="store_true", help="run mutants triaged equivalent too"
    )
    auto.add_argument(
        "--rebuild-report",
        metavar="DIR",
        help="write the report of an earlier --auto run in DIR again (results.json, "
        "summary.md, pages) from its journal, with the triage file as it is now; runs nothing",
    )
    auto.add_argument(
        "--experiments",
        metavar="IDS",
        help="--auto: judge against these experiments only (comma-separated ids or labels, "
        "e.g. 'Y,G-retry_race'): to see whether a new check catches given survivors; a "
        "mutant they miss is reported survived against them alone, and the run says so",
    )
    auto.add_argument(
        "--min-score",
        type=float,
        default=90.0,
        help="percent of non-equivalent mutants that must be caught for exit 0 (default 90)",
    )


def main(args: argparse.Namespace) -> int:
    if args.rebuild_report:
        with stopping.interruptible():  # it only reads and builds: a signal ends it at once
            return _rebuild(args)
    if args.every_catcher and (args.auto or args.explore):
        raise UsageError("--every-catcher is for named mutants run against the matrix")
    if args.auto:
        if args.seed is None:
            args.seed = 0
        return _auto(args)
    from harness.mutation.named import MutantListUnavailable, run_mutants

    if args.diff:
        raise UsageError("--diff shows generated mutants' diffs: add --auto")
    settings = settings_from_args(args)
    if args.list:
        return _list_named(args, settings)
    reap_and_report(settings.work_dir, print)
    if args.explore:
        return _explore(args, settings)
    try:
        return run_mutants(
            settings,
            args.names,
            report_root=Path(args.report_dir),
            parallel=args.jobs or 3,
            shard=shard_from_args(args),
            fail_on=args.fail_on,
            run_pages=not args.no_pages,
            every_catcher=args.every_catcher,
        )
    except (MutantListUnavailable, ValueError) as exc:
        raise UsageError(str(exc)) from exc


def _auto(args: argparse.Namespace) -> int:
    from harness.evidence.archive import git_commit
    from harness.mutation import auto_report, catalog, triage
    from harness.mutation.auto import AutoOptions, BaselineFailed, entry, run_generated
    from harness.mutation.named import MutantListUnavailable, list_mutants
    from harness.mutation.ordering import CatcherOrder

    if args.worker_cmd:
        raise UsageError("--auto mutates the reference implementation; drop --worker-cmd")
    shard = shard_from_args(args)
    mutants = catalog.generate(REPO_ROOT)
    try:
        chosen = catalog.select(
            mutants, args.names, language=args.language, sample=args.sample, seed=args.seed
        )
        judged = triage.load(Path(args.triage))
    except (catalog.UnknownMutantId, triage.TriageError) as exc:
        raise UsageError(str(exc)) from exc
    selected = chosen
    if shard.count > 1:
        from harness.mutation.auto_merge import part

        if shard.count > len(selected):
            raise UsageError(f"--shard {shard}: only {len(selected)} mutant(s) are selected")
        chosen = part(selected, shard.index, shard.count)
    if args.list or args.diff:
        for m in chosen:
            mark = " [equivalent]" if m.id in judged.equivalent else ""
            print(f"{m.id}\n    {m.path}:{m.line}  {m.describe()}{mark}")
            if args.diff:
                print(m.diff((REPO_ROOT / m.path).read_text(encoding="utf-8")))
        part_note = f" (part {shard} of {len(selected)} selected)" if shard.count > 1 else ""
        print(f"{len(chosen)} of {len(mutants)} generated mutant(s){part_note}")
        return 0
    if not chosen:
        raise UsageError("no mutant selected")
    settings = settings_from_args(args)
    report_root = Path(args.report_dir)
    part_tag = f"-part{shard.index}of{shard.count}" if shard.count > 1 else ""
    report_dir = report_root / (
        "automutants-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + part_tag
    )
    report_dir.mkdir(parents=True, exist_ok=True)
    order = CatcherOrder()
    try:
        named = list_mutants(settings.worker_cmd)
        order = CatcherOrder((m.alters, m.catchers) for m in named)
    except MutantListUnavailable:
        pass  # only an ordering hint
    learned = report_root / LEARNED_FILE
    order.load(learned)
    options = AutoOptions(
        repo_root=REPO_ROOT,
        report_dir=report_dir,
        parallel=args.jobs or 4,
        concurrent=args.mutants_at_once,
        budget_s=args.budget,
        baseline=not args.no_baseline,
        confirm=not args.no_confirm,
        run_equivalent=args.run_equivalent,
        learned=learned,
        only=tuple(x.strip() for x in (args.experiments or "").split(",") if x.strip()),
    )
    if options.only:
        import scenarios
        from harness.engine.runner import jobs_for

        every = jobs_for(scenarios.all_modules(), 1)
        known = {j.spec.id for j in every} | {j.label for j in every}
        unknown = [x for x in options.only if x not in known]
        if unknown:
            raise UsageError(
                f"--experiments {','.join(unknown)}: no such experiment (ids A.. or labels "
                "such as E-frozen_dispatcher; `fencecheck list` lists them)"
            )
    stale = judged.stale(m.id for m in mutants)
    print(
        f"fencecheck mutants --auto: {len(chosen)} of {len(mutants)} generated mutant(s)"
        + (f", judged against {','.join(options.only)} only" if options.only else "")
        + (f" (part {shard} of the {len(selected)} selected)" if shard.count > 1 else "")
        + f", {options.parallel} experiment(s) at once per mutant; reports in {report_dir}",
        flush=True,
    )
    for mutant_id in stale:
        print(f"  warning: triage entry {mutant_id} matches no generated mutant", flush=True)
    run_info: dict[str, Any] = {
        "command": "fencecheck mutants " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
        "generated": len(mutants),
        "selected": len(chosen),
        # The whole selection, so `fencecheck merge` knows what each part owned.
        "selected_total": len(selected),
        "shard": str(shard) if shard.count > 1 else None,
        "selected_ids": [m.id for m in selected] if shard.count > 1 else None,
        "sample": args.sample,
        "seed": args.seed if args.sample else None,
        "language": args.language,
        "jobs": options.parallel,
        "mutants_at_once": options.concurrent,
        "budget_s": args.budget,
        "source_digest": catalog.source_digest(REPO_ROOT),
        "commit": git_commit(),
        "started_utc": _utc(),
        "load_start": _load(),
        "stale_triage_entries": stale,
    }
    _write_run(report_dir, run_info)
    try:
        run = run_generated(
            settings, chosen, judged, order, options, lambda m: print(f"  {m}", flush=True)
        )
    except BaselineFailed as exc:
        print(f"fencecheck: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN
    run_info |= {
        "finished_utc": _utc(),
        "load_end": _load(),
        "wall_s": round(run.wall_s, 1),
        "baseline_s": None if run.baseline_s is None else round(run.baseline_s, 1),
    }
    _write_run(report_dir, run_info)
    entries = [entry(o, REPO_ROOT) for o in run.outcomes]
    md_path = auto_report.write(report_dir, run_info, entries)
    result = auto_report.score(len(mutants), entries)
    survivors = auto_report.survivors_text(entries)
    if survivors:
        print("\n" + survivors)
    print(auto_report.publish(report_dir, pages=not args.no_pages))
    print(f"\n{result.line()}\n  {md_path}\n  {report_dir / auto_report.RESULTS}")
    if stopping.requested():  # the report holds what was judged; the run did not finish
        print(f"fencecheck: {stopping.reason()}: the mutants not judged are listed as not run")
        return stopping.exit_status()
    if result.rate is None:
        return EXIT_UNKNOWN
    return 0 if 100 * result.rate >= args.min_score else 1


def _rebuild(args: argparse.Namespace) -> int:
    """The report of an earlier --auto run again, with today's triage file."""
    from harness.mutation import auto_report, catalog, triage
    from harness.mutation.auto import RUN_FILE

    folder = Path(args.rebuild_report)
    if not (folder / RUN_FILE).is_file():
        raise UsageError(f"{folder} has no {RUN_FILE}: give the folder a --auto run wrote")
    try:
        judged = triage.load(Path(args.triage))
    except triage.TriageError as exc:
        raise UsageError(str(exc)) from exc
    diffs = {
        m.id: m.diff((REPO_ROOT / m.path).read_text(encoding="utf-8"))
        for m in catalog.generate(REPO_ROOT)
    }
    data = auto_report.rebuild(folder, judged, diffs)
    print(auto_report.publish(folder, pages=not args.no_pages))
    print(f"{data['summary']}\n  {folder / auto_report.SUMMARY}")
    return 0


def _named(args: argparse.Namespace, settings: Settings) -> list[Mutant]:
    """The named mutants asked for (all when none is named); a usage error names the
    unknown ones and lists the known."""
    from harness.mutation.named import MutantListUnavailable, list_mutants

    try:
        known = {m.name: m for m in list_mutants(settings.worker_cmd)}
    except MutantListUnavailable as exc:
        raise UsageError(str(exc)) from exc
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise UsageError(f"unknown mutant(s) {unknown}; known: {', '.join(sorted(known))}")
    chosen = [known[n] for n in args.names] if args.names else list(known.values())
    return chosen


def _list_named(args: argparse.Namespace, settings: Settings) -> int:
    """The worker's named mutants (all, or the ones named), one per line; runs nothing."""
    chosen = _named(args, settings)
    for m in chosen:
        print(f"{m.name}  (rule {m.rule}; caught by {','.join(m.catchers)})\n    {m.description}")
    print(f"{len(chosen)} named mutant(s) of `{settings.worker_command_text()}`")
    return 0


def _write_run(report_dir: Path, info: dict[str, Any]) -> None:
    from harness.mutation.auto import RUN_FILE

    (report_dir / RUN_FILE).write_text(json.dumps(info, indent=2) + "\n")


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def _explore(args: argparse.Namespace, settings: Settings) -> int:
    from harness.explore.mutants import run_explore_mutants

    chosen = _named(args, settings)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    report_dir = Path(args.report_dir) / f"explore-mutants-{stamp}"
    report_dir.mkdir(parents=True, exist_ok=True)
    return run_explore_mutants(
        settings,
        chosen,
        report_dir=report_dir,
        budget_s=args.budget if args.budget is not None else 300.0,
        shrink_budget_s=args.shrink_budget,
        seed=args.seed if args.seed is not None else 1,
        lanes=args.jobs,
    )

"""``fencecheck merge DIR... --into DIR``: the parts of a sharded run (or mutant run) as one."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import UsageError
from harness.evidence.gate import add_gate_option

NAME = "merge"
HELP = "merge the run directories of `run --shard K/N` (or `mutants --shard K/N`) parts into one"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dirs",
        nargs="+",
        type=Path,
        help="run directories of the parts, or directories holding them (e.g. downloaded "
        "CI artifacts)",
    )
    parser.add_argument(
        "--into", required=True, type=Path, help="the merged run directory (new or empty)"
    )
    add_gate_option(parser)
    parser.add_argument(
        "--min-score",
        type=float,
        default=90.0,
        help="--auto parts: percent of non-equivalent mutants that must be caught for exit 0",
    )


def main(args: argparse.Namespace) -> int:
    from harness.evidence.gate import gate_exit, gate_line, mutants_gate
    from harness.evidence.merge import MergeRefused, merge
    from harness.evidence.summary import overall, terminal_table
    from harness.mutation.auto_merge import find_auto_parts

    auto_parts = find_auto_parts(args.dirs)
    if auto_parts:
        return _merge_auto(auto_parts, args)

    try:
        merged = merge(args.dirs, args.into)
    except MergeRefused as exc:
        raise UsageError(str(exc)) from exc
    count = merged.parts[0].record.shard_count
    what = "experiment run(s)" if merged.kind == "run" else "mutant(s)"
    print(
        f"fencecheck merge {merged.run_id}: {len(merged.parts)} of {count} part(s), "
        f"{len(merged.results) + len(merged.mutants)} {what}"
    )
    for why in merged.passed_over:
        print(f"  passed over {why}")
    for k in merged.missing_parts:
        print(f"  part {k}/{count} is missing: its {what} are unknown")
    for part in merged.parts:
        if part.record.finished_at is None:
            why = part.record.interrupted or "it never wrote its end (killed?)"
            print(
                f"  part {part.record.shard} ({part.path}) did not finish: {why}; "
                f"what it did not complete is unknown"
            )
    print()
    if merged.kind == "mutants":
        for entry in merged.mutants:
            caught = ",".join(entry["caught_by"]) or (
                "NOT RUN" if entry.get("not_run") else "NOT CAUGHT"
            )
            print(f"  {entry['mutant']}: {caught}  {str(entry['detail'])[:90]}")
        caught_count = sum(bool(e["caught_by"]) for e in merged.mutants)
        print(f"\nmutation score: {caught_count}/{len(merged.mutants)}; reports in {merged.into}")
        code, line = mutants_gate(merged.mutants, args.fail_on)
        print(line)
        return code
    results = merged.results
    print(terminal_table(results))
    print(
        f"\noverall: {overall(results).value.upper()}; slowest part {merged.wall_s:.1f}s; "
        f"reports in {merged.into}"
    )
    print(
        f"  pages {merged.pages}; evidence digest {merged.digest} (fencecheck verify {merged.into})"
    )
    print(gate_line(results, args.fail_on))
    return gate_exit(results, args.fail_on)


def _merge_auto(parts: list[Path], args: argparse.Namespace) -> int:
    """The parts of `mutants --auto --shard K/N` as one campaign, one score."""
    from harness.cli.common import REPO_ROOT
    from harness.mutation.auto_merge import AutoMergeRefused, merge_auto

    try:
        merged = merge_auto(parts, args.into, REPO_ROOT)
    except AutoMergeRefused as exc:
        raise UsageError(str(exc)) from exc
    count = merged.parts[0].count
    print(
        f"fencecheck merge: {len(merged.parts)} of {count} --auto part(s), {len(merged.entries)} mutant(s)"
    )
    for k in merged.missing:
        print(f"  part {k}/{count} is missing: its mutants are not run")
    assert merged.score is not None
    print(f"\n{merged.score.line()}\n{merged.published}\nreports in {merged.into}")
    if merged.score.rate is None or merged.missing:
        return 2
    return 0 if 100 * merged.score.rate >= args.min_score else 1

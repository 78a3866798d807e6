"""``fencecheck report``: rebuild a run's pages from its archives, or compare two runs."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli.common import UsageError
from harness.evidence import bounded_read

if TYPE_CHECKING:
    from harness.evidence.run_dir import Entry

NAME = "report"
HELP = "rebuild a run's HTML pages from its archives alone, or --compare two runs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("report_dir", nargs="?", help="a run's folder: reports/<run-id>")
    parser.add_argument(
        "--out",
        help="write the pages to this folder instead of into the run's folder (which is "
        "then left untouched; the pages link to its evidence)",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("RUN_A", "RUN_B"),
        help="show what changed from RUN_A to RUN_B: verdicts per experiment, worker "
        "digest, PostgreSQL version and the other run facts; exit 1 if an experiment "
        "that always passed in RUN_A did not in RUN_B",
    )
    parser.add_argument("--html", help="with --compare: also write the comparison as a page here")
    parser.epilog = (
        "exit 0 when built, 1 when an archive is unreadable (it fails the published schema "
        "or cannot be parsed: shown and counted apart, no verdict or page built from it) or "
        "the sealed evidence changed, 64 for a bad path or a refused file (docs/running.md)"
    )


def main(args: argparse.Namespace) -> int:
    from harness.evidence.run_dir import NotARunDirectory

    try:
        if args.compare:
            if args.report_dir:
                raise UsageError("give either REPORT_DIR or --compare RUN_A RUN_B, not both")
            return _compare(Path(args.compare[0]), Path(args.compare[1]), args.html)
        if not args.report_dir:
            raise UsageError("give the run's folder: fencecheck report reports/<run-id>")
        if not Path(args.report_dir).is_dir():
            raise UsageError(
                f"{args.report_dir} is not a folder: give a run's folder, reports/<run-id>"
            )
        if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
            raise UsageError(f"--out {args.out} exists and is not a folder")
        return _rebuild(Path(args.report_dir), Path(args.out) if args.out else None)
    except NotARunDirectory as exc:
        raise UsageError(str(exc)) from exc


def _rebuild(report_dir: Path, out: Path | None) -> int:
    from harness.evidence import manifest
    from harness.evidence.html import build_run_pages

    started = time.perf_counter()
    unreadable: list[Entry] = []
    sealed = (report_dir / manifest.MANIFEST_NAME).exists()
    if out is None and sealed:
        # Rebuilding in place reseals the folder: only over the evidence it was sealed with.
        check = manifest.verify_report(report_dir)
        evidence = [
            p for p in check.changed + check.removed + check.added if not manifest.is_view(p)
        ]
        if evidence or check.manifest_changed:
            print(f"fencecheck report: {report_dir} was sealed, and its evidence changed since:")
            for p in [*check.manifest_changed, *evidence]:
                print(f"  {p}")
            print(
                "not rebuilding in place (it would seal the changed evidence); run "
                "`fencecheck verify` for details, or build elsewhere with --out DIR"
            )
            return 1
    if _is_automutants(report_dir):
        if out is not None:
            raise UsageError("a mutants --auto folder's pages are rebuilt in place; drop --out")
        from harness.evidence.html.automutants import write_automutants_pages

        index = write_automutants_pages(report_dir)
    elif (report_dir / "mutants.json").is_file() and not (report_dir / "archives").is_dir():
        if out is not None:
            raise UsageError("a mutants folder's pages are rebuilt in place; drop --out")
        from harness.evidence.html.mutants import write_mutants_pages

        index = write_mutants_pages(report_dir)
    else:
        index, entries = build_run_pages(report_dir, out, sealed=out is None)
        unreadable = [e for e in entries if e.problem is not None]
    if out is None:
        manifest.write_manifest(report_dir)
        note = "resealed" if sealed else "sealed now (it had no MANIFEST.sha256: the seal covers "
        note += "" if sealed else "its files as they are now, not as the run left them)"
        print(f"MANIFEST.sha256 {note}")
    pages = len(list(index.parent.glob("**/experiments/*.html")))
    print(f"{index} and {pages} experiment page(s) built in {time.perf_counter() - started:.2f}s")
    if unreadable:
        print(
            f"{len(unreadable)} archive(s) UNREADABLE, counted apart as unknown (no verdict "
            "or page is built from an archive that fails the published schema):"
        )
        for entry in unreadable:
            print("\n".join(f"  {line}" for line in (entry.problem or "").splitlines()))
        return 1
    return 0


def _is_automutants(report_dir: Path) -> bool:
    """A folder ``fencecheck mutants --auto`` wrote (its results.json says so)."""
    results = report_dir / "results.json"
    if not results.exists():
        return False
    try:
        data = bounded_read.load_json(results)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("kind") == "automutants"


def _compare(a: Path, b: Path, html: str | None) -> int:
    from harness.evidence.compare import compare_runs, comparison_lines, comparison_page

    comparison = compare_runs(a, b)
    print("\n".join(comparison_lines(comparison)))
    if html:
        Path(html).write_text(comparison_page(comparison))
        print(f"page: {html}")
    return 1 if comparison.regressions else 0

"""Run reports: a Markdown summary, JUnit XML for CI, and a terminal table."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.verdict import Verdict, reason_line


def label_of(experiment_id: str, variant: str | None, repeat_index: int) -> str:
    """A job's file-safe name (``E-query-r2``): its archive is ``archives/<label>.yaml``."""
    base = experiment_id + (f"-{variant}" if variant else "")
    return base + (f"-r{repeat_index}" if repeat_index else "")


#: Where a run keeps the evidence of each experiment's attempts before its last
#: one (``<label>/attempt-N.yaml`` and ``attempt-N-logs/``; runner.again_while_unknown).
ATTEMPTS_DIR = "earlier-attempts"


@dataclass
class ExperimentResult:
    """The outcome of one experiment run (one variant, one repetition)."""

    experiment_id: str
    title: str
    variant: str | None
    repeat_index: int
    verdict: Verdict
    reason: str
    duration_s: float
    natural_wait_s: float
    archive_path: Path | None
    invariant: str
    failed_checks: list[str] = field(default_factory=list)
    #: Where the run's wall time went (harness/engine/phases.py), in seconds.
    phases_s: dict[str, float] = field(default_factory=dict)
    #: Calls of each database function the experiment's workers ran (None: not
    #: known, e.g. a database that failed over), for generated mutants' reach.
    functions_called: dict[str, int] | None = None
    #: Database functions the server named in the context of an error it
    #: logged for the experiment's database (a call that raised is not counted
    #: above), when the worker was traced (Settings.trace_calls).
    functions_raised: list[str] | None = None
    #: ``<file>:<function>`` of each reference implementation function its
    #: processes ran, when the worker was traced (Settings.trace_calls).
    python_calls: list[str] | None = None
    #: The state-space cells its evidence shows reached (harness/explore/cells.py).
    state_cells: dict[str, int] | None = None
    #: The layer of the system it judges: queue or workflow ("" when not known).
    layer: str = ""
    #: Attempts before this one that ended unknown (runner.again_while_unknown):
    #: "attempt N: unknown: <reason> (evidence <archive>)".
    earlier_attempts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Every list a person reads shows the reason as one short line; the
        # archive (verdict_reason) keeps the whole text.
        self.reason = reason_line(self.reason)

    @property
    def name(self) -> str:
        base = self.experiment_id + (f"[{self.variant}]" if self.variant else "")
        return base + (f"#{self.repeat_index}" if self.repeat_index else "")

    @property
    def label(self) -> str:
        return label_of(self.experiment_id, self.variant, self.repeat_index)


def failed_check_lines(checks: Sequence[dict[str, Any]]) -> list[str]:
    """One line per check of an archive that did not hold."""
    return [
        f"{c['kind']} {c['name']}: expected {c['expected']}, observed {c['observed']}"
        for c in checks
        if not c["ok"]
    ]


def overall(results: Sequence[ExperimentResult]) -> Verdict:
    return Verdict.merge(r.verdict for r in results)


def terminal_table(results: Sequence[ExperimentResult]) -> str:
    rows = [("experiment", "verdict", "wall s", "natural s", "reason")]
    for r in results:
        rows.append(
            (
                f"{r.name} {r.title}"[:48],
                r.verdict.words.upper(),
                f"{r.duration_s:.2f}",
                f"{r.natural_wait_s:.2f}",
                r.reason[:70],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(row))
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _write_atomically(path: Path, text: str) -> Path:
    # A reader (or an escalated stop writing the same report) never sees half.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def cell(text: str) -> str:
    """``text`` as one Markdown table cell: a newline would end the row and a
    ``|`` would end the cell, so line breaks become ``<br>`` and bars are escaped."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "<br>".join(line.replace("|", "\\|") for line in lines)


def write_summary(
    path: Path,
    results: Sequence[ExperimentResult],
    *,
    header: dict[str, str],
    wall_s: float,
    interrupted: str | None = None,
    title: str = "fencecheck run",
    verdict_text: str | None = None,
    cells_table: bool = True,
) -> Path:
    """``verdict_text`` replaces the merged verdict of the results where the
    command judges otherwise (explore: unknown schedules do not fail a search)."""
    verdict = overall(results)
    counts = {v: sum(1 for r in results if r.verdict is v) for v in Verdict}
    natural = sum(r.natural_wait_s for r in results)
    status = (
        f"**INTERRUPTED** ({interrupted}): experiments marked interrupted did not finish; "
        "nothing they would have shown is proven"
        if interrupted
        else "complete"
    )
    lines = [
        f"# {title}" + (" (INTERRUPTED)" if interrupted else ""),
        "",
        f"- **status**: {status}",
        *(f"- **{k}**: {v}" for k, v in header.items()),
        f"- **overall verdict**: {verdict_text or verdict.value}",
        f"- **counts**: {counts[Verdict.PASS]} pass, {counts[Verdict.FAIL]} fail, "
        f"{counts[Verdict.UNKNOWN]} unknown, {counts[Verdict.NOT_APPLICABLE]} not applicable",
        f"- **wall time**: {wall_s:.1f} s (sum of natural waits {natural:.1f} s)",
        "",
        "| experiment | layer | title | verdict | wall s | natural wait s | invariant | reason | archive |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    judged = [r for r in results if r.verdict is not Verdict.NOT_APPLICABLE]
    apart = [r for r in results if r.verdict is Verdict.NOT_APPLICABLE]
    for r in judged:
        archive = r.archive_path.name if r.archive_path else "-"
        lines.append(
            f"| {cell(r.name)} | {cell(r.layer or '-')} | {cell(r.title)} | **{r.verdict.value}** | "
            f"{r.duration_s:.2f} | "
            f"{r.natural_wait_s:.2f} | {cell(r.invariant)} | {cell(r.reason)} | {cell(archive)} |"
        )
    if apart:
        # Shown apart: the system said it lacks what these need, so they prove
        # nothing about it either way and were not run.
        lines += [
            "",
            f"## Not applicable ({len(apart)}): the system declares it lacks what these need",
            "",
            "| experiment | layer | title | why | archive |",
            "|---|---|---|---|---|",
        ]
        for r in apart:
            archive = r.archive_path.name if r.archive_path else "-"
            lines.append(
                f"| {cell(r.name)} | {cell(r.layer or '-')} | {cell(r.title)} | {cell(r.reason)} | "
                f"{cell(archive)} |"
            )
    from harness.explore.cell_coverage import from_results

    coverage = from_results(results) if cells_table else None
    if coverage is not None:
        lines += ["", "## State-space coverage (cells the evidence shows reached)", ""]
        lines.append(coverage.table())
    return _write_atomically(path, "\n".join(lines) + "\n")


def write_junit(
    path: Path,
    results: Sequence[ExperimentResult],
    *,
    suite: str,
    interrupted: str | None = None,
) -> Path:
    """JUnit XML: fail → <failure>, unknown → <error> (it proved nothing), not
    applicable → <skipped> (the system lacks what it needs); an interrupted run
    says so in a property and in the suite's system-err."""
    root = ET.Element(
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(sum(r.verdict is Verdict.FAIL for r in results)),
        errors=str(sum(r.verdict is Verdict.UNKNOWN for r in results)),
        skipped=str(sum(r.verdict is Verdict.NOT_APPLICABLE for r in results)),
        time=f"{sum(r.duration_s for r in results):.3f}",
    )
    properties = ET.SubElement(root, "properties")
    ET.SubElement(
        properties, "property", name="status", value="interrupted" if interrupted else "complete"
    )
    if interrupted:
        ET.SubElement(properties, "property", name="interrupted", value=interrupted)
    for r in results:
        case = ET.SubElement(
            root,
            "testcase",
            classname=f"fencecheck.{r.experiment_id}",
            name=f"{r.name} {r.title}",
            time=f"{r.duration_s:.3f}",
        )
        detail = "\n".join(r.failed_checks) or r.reason
        if r.verdict is Verdict.FAIL:
            ET.SubElement(case, "failure", message=r.reason).text = detail
        elif r.verdict is Verdict.UNKNOWN:
            ET.SubElement(case, "error", message=r.reason).text = detail
        elif r.verdict is Verdict.NOT_APPLICABLE:
            ET.SubElement(case, "skipped", message=r.reason)
        if r.archive_path:
            ET.SubElement(case, "system-out").text = f"evidence: {r.archive_path}"
    if interrupted:
        ET.SubElement(
            root, "system-err"
        ).text = f"the run was {interrupted}; experiments marked interrupted did not finish"
    data = ET.tostring(root, encoding="unicode", xml_declaration=True)
    return _write_atomically(path, data + "\n")


def write_results_json(
    path: Path,
    results: Sequence[ExperimentResult],
    *,
    run: dict[str, object] | None = None,
) -> Path:
    """The run as JSON: ``run`` (id, status ``complete`` or ``interrupted``, by
    what, exit code, ...) and ``results``, one entry per experiment run."""
    return _write_atomically(
        path,
        json.dumps(
            {
                "run": run or {},
                "overall": overall(results).value,
                "results": [
                    {
                        "experiment": r.experiment_id,
                        "variant": r.variant,
                        "repeat": r.repeat_index,
                        "verdict": r.verdict.value,
                        "layer": r.layer or None,
                        "reason": r.reason,
                        "duration_s": round(r.duration_s, 3),
                        "natural_wait_s": r.natural_wait_s,
                        "phases_s": r.phases_s,
                        "archive": str(r.archive_path) if r.archive_path else None,
                        "earlier_attempts": r.earlier_attempts,
                    }
                    for r in results
                ],
            },
            indent=2,
        )
        + "\n",
    )

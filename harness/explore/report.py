"""A campaign's report directory: summary.md, results.json, junit.xml,
explore.json (counts, rate, coverage, time per phase, the violation) and the
HTML pages of the archives.

The per-schedule files (``results.json``, ``junit.xml``) have the matrix's
format, so CI tooling that reads a run reads a campaign too; a schedule whose
faults did not take effect is an *unknown* there (JUnit error), never a pass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from statistics import mean, median
from typing import Any

from harness.evidence.summary import write_junit, write_results_json, write_summary
from harness.explore.campaign import CampaignOutcome, ScheduleResult

#: What a campaign's exit code says (unknown schedules do not fail a search;
#: they count against its unknown share).
CAMPAIGN_VERDICT = {
    0: "no violation found",
    1: "an invariant broke",
    2: "nothing conclusive",
}


def time_split(results: list[ScheduleResult]) -> dict[str, float]:
    """Mean seconds per phase of a schedule run (where the time goes)."""
    keys = sorted({k for r in results for k in r.timing_s})
    return {k: round(mean(r.timing_s.get(k, 0.0) for r in results), 2) for k in keys}


def facts(outcome: CampaignOutcome) -> dict[str, Any]:
    results = outcome.results
    counts = outcome.counts()
    done = len(results)
    out: dict[str, Any] = {
        "schedules": done,
        "counts": counts,
        "unknown_share": round((counts["no_effect"] + counts["unknown"]) / done, 3)
        if done
        else None,
        "wall_s": round(outcome.wall_s, 1),
        "search_s": round(outcome.wall_s - outcome.shrink_s, 1),
        "schedules_per_minute": round(done / (outcome.wall_s - outcome.shrink_s) * 60, 2)
        if done and outcome.wall_s > outcome.shrink_s
        else None,
        "median_schedule_s": round(median(r.duration_s for r in results), 2) if results else None,
        "time_per_phase_s": time_split(results),
        "coverage": outcome.coverage.as_dict(),
        "state_cells": outcome.cells.as_dict(),
        "interrupted": outcome.interrupted,
    }
    if outcome.first_violation is not None:
        first = outcome.first_violation
        out["first_violation"] = {
            "label": first.label,
            "after_schedules": results.index(first) + 1 if first in results else None,
            "after_s": round(outcome.first_violation_after_s or 0.0, 1),
            "broken": first.broken,
            "size": first.schedule.size,
        }
    if outcome.minimal is not None:
        out["shrunk"] = {
            "label": outcome.minimal.label,
            "size": outcome.minimal.schedule.size,
            "faults": len(outcome.minimal.schedule.faults),
            "attempts": len(outcome.shrink_runs),
            "shrink_s": round(outcome.shrink_s, 1),
        }
    return out


def write_report(
    report_dir: Path,
    outcome: CampaignOutcome,
    *,
    header: Mapping[str, str],
    violation: tuple[Path, str] | None,
    exit_code: int,
    interrupted: str | None = None,
) -> dict[str, Any]:
    """Every file of the campaign's report, sealed last (MANIFEST.sha256, so
    `fencecheck verify` checks a campaign as it checks a run); returns the
    facts of explore.json."""
    experiments = [r.experiment for r in outcome.results + outcome.shrink_runs if r.experiment]
    summary = report_dir / "summary.md"
    write_summary(
        summary,
        experiments,
        header=dict(header),
        wall_s=outcome.wall_s,
        interrupted=interrupted,
        title="fencecheck explore",
        cells_table=False,  # the campaign's own below says why a cell was not reached
        verdict_text=CAMPAIGN_VERDICT.get(exit_code, "interrupted") + f" (exit {exit_code})",
    )
    write_junit(
        report_dir / "junit.xml",
        experiments,
        suite=f"fencecheck explore {header.get('run', '')}",
        interrupted=interrupted,
    )
    write_results_json(
        report_dir / "results.json",
        experiments,
        run={
            "id": header.get("run", ""),
            "command": "explore",
            "status": "interrupted" if interrupted else "complete",
            "interrupted_by": interrupted,
            "exit_code": exit_code,
            "verdict": CAMPAIGN_VERDICT.get(exit_code, "interrupted"),
            "seed": header.get("seed"),
        },
    )
    data = facts(outcome)
    if violation is not None:
        data["violation"] = {"schedule": str(violation[0]), "replay": violation[1]}
    (report_dir / "explore.json").write_text(json.dumps(data, indent=2) + "\n")
    counts = data["counts"]
    lines = [
        "",
        "## Exploration",
        "",
        f"- schedules run: {data['schedules']} ({counts['pass']} pass, {counts['fail']} fail, "
        f"{counts['no_effect']} with a fault not in effect, {counts['unknown']} unknown); "
        f"unknown share {data['unknown_share']}",
        f"- rate: {data['schedules_per_minute']} schedules per minute; median schedule "
        f"{data['median_schedule_s']} s; mean seconds per phase {data['time_per_phase_s']}",
    ]
    if "first_violation" in data:
        fv = data["first_violation"]
        lines.append(
            f"- first violation: {fv['label']} after {fv['after_schedules']} schedule(s), "
            f"{fv['after_s']} s: {', '.join(fv['broken'])}"
        )
    if "shrunk" in data:
        sh = data["shrunk"]
        lines.append(
            f"- shrunk to size {sh['size']} ({sh['faults']} fault(s)) in {sh['attempts']} "
            f"attempt(s), {sh['shrink_s']} s: {sh['label']}"
        )
    if violation is not None:
        lines += [f"- minimal schedule: `{violation[0]}`", f"- replay: `{violation[1]}`"]
    lines += ["", "### Coverage (injection point x fault kind, faults that took effect)", ""]
    lines.append(outcome.coverage.table())
    lines += ["", "### State-space coverage (cells of the contract reached, by the evidence)", ""]
    lines.append(outcome.cells.table())
    with summary.open("a") as fh:
        fh.write("\n".join(lines) + "\n")
    from harness.evidence.run_report import seal_run

    seal_run(report_dir, interrupted=interrupted is not None)
    return data

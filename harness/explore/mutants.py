"""``fencecheck mutants --explore``: does exploration, with the scenarios out of
the loop, find each named mutant? One campaign per mutant (its own shared
services, migrated with the mutant's SQL overlays), with a time budget each.

Found means a schedule's verdict was *fail* (a global invariant broke); a
mutant whose campaign only saw pass or unknown is not found.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import stopping
from harness.engine.environment import Settings, SharedServices
from harness.explore.campaign import Campaign, CampaignConfig
from harness.explore.generate import Shape
from harness.explore.report import facts
from harness.explore.shrink import write_violation
from harness.mutation.named import Mutant


@dataclass
class ExploreFinding:
    mutant: str
    rule: int
    found: bool
    schedules: int
    to_first_s: float | None
    schedules_to_first: int | None
    broken: list[str]
    shrunk_size: int | None
    first_size: int | None
    wall_s: float
    replay: str | None = None


def explore_mutant(
    mutant: Mutant,
    base: Settings,
    report_dir: Path,
    *,
    budget_s: float,
    shrink_budget_s: float,
    seed: int,
    shape: Shape,
    stop: threading.Event,
    lanes: int,
) -> ExploreFinding:
    started = time.monotonic()
    settings = dataclasses.replace(base, mutant=mutant.name, keep=False)
    out = report_dir / mutant.name
    out.mkdir(parents=True, exist_ok=True)
    config = CampaignConfig(
        seed=seed, shape=shape, budget_s=budget_s, shrink_budget_s=shrink_budget_s
    )
    with SharedServices(settings) as shared:
        outcome = Campaign(shared, config, report_dir=out, stop=stop).run()
    data = facts(outcome)
    replay = None
    if outcome.minimal is not None:
        replay = write_violation(out, outcome.minimal, mutant=mutant.name, worker_cmd=None)[1]
    fv: dict[str, Any] = data.get("first_violation", {})
    return ExploreFinding(
        mutant=mutant.name,
        rule=mutant.rule,
        found=outcome.first_violation is not None,
        schedules=len(outcome.results),
        to_first_s=fv.get("after_s"),
        schedules_to_first=fv.get("after_schedules"),
        broken=list(fv.get("broken", [])),
        shrunk_size=outcome.minimal.schedule.size if outcome.minimal else None,
        first_size=fv.get("size"),
        wall_s=round(time.monotonic() - started, 1),
        replay=replay,
    )


def table(findings: Sequence[ExploreFinding]) -> str:
    rows = [("mutant", "rule", "found", "schedules", "s to 1st", "size 1st->shrunk", "broken")]
    for f in findings:
        rows.append(
            (
                f.mutant,
                str(f.rule),
                "FOUND" if f.found else "not found",
                f"{f.schedules_to_first or '-'}/{f.schedules}",
                f"{f.to_first_s:.0f}" if f.to_first_s is not None else "-",
                f"{f.first_size}->{f.shrunk_size}" if f.found else "-",
                ", ".join(f.broken)[:70],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join([*(r[i].ljust(widths[i]) for i in range(6)), r[6]]) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def run_explore_mutants(
    settings: Settings,
    chosen: Sequence[Mutant],
    *,
    report_dir: Path,
    budget_s: float,
    shrink_budget_s: float,
    seed: int,
    shape: Shape | None = None,
    lanes: int = 3,
) -> int:
    """Every chosen mutant in turn; prints the table, writes explore-mutants.json.
    Exit 0 when every mutant was found, 1 otherwise."""
    stop = threading.Event()
    forget = stopping.on_stop(lambda _why: stop.set())  # no new mutant after a signal
    findings: list[ExploreFinding] = []
    print(
        f"fencecheck mutants --explore: {len(chosen)} mutant(s), budget {budget_s:.0f}s each, "
        f"seed {seed}; reports in {report_dir}",
        flush=True,
    )
    try:
        for m in chosen:
            if stop.is_set():
                break
            f = explore_mutant(
                m, settings, report_dir, budget_s=budget_s, shrink_budget_s=shrink_budget_s,
                seed=seed, shape=shape or Shape(), stop=stop, lanes=lanes,
            )  # fmt: skip
            findings.append(f)
            mark = (
                f"FOUND after {f.schedules_to_first} schedule(s), {f.to_first_s}s, shrunk "
                f"{f.first_size}->{f.shrunk_size}: {', '.join(f.broken)}"
                if f.found
                else f"not found in {f.schedules} schedule(s)"
            )
            print(f"  {m.name} (rule {m.rule}): {mark} [{f.wall_s}s]", flush=True)
            (report_dir / "explore-mutants.json").write_text(
                json.dumps([dataclasses.asdict(x) for x in findings], indent=2) + "\n"
            )
    finally:
        forget()
    if stop.is_set():
        print(
            f"mutants --explore: INTERRUPTED ({stopping.reason()}) after {len(findings)} mutant(s)"
        )
    print()
    print(table(findings))
    found = sum(f.found for f in findings)
    print(f"\nexplore found {found}/{len(findings)} mutant(s)")
    return 0 if found == len(findings) else 1

"""Coverage of the contract's state space: the cells each experiment reached
(recorded in its archive as ``state_cells``), summed over a run or a
campaign, with every cell never reached listed and why.

Invariants:
- a cell counts as reached only where :mod:`harness.explore.cells` placed an
  observed operation in it (the audit trail, the harness's own requests, the
  tool's and broker's logs), never because a step meant to reach it;
- every cell of the state space is in exactly one of: reached, declared
  unreachable (the contract's reason), or not reached (with the reason this
  campaign gives: never drawn, drawn but its state never came about, no
  recipe in the workload for one of its values);
- recording never changes a verdict: a failure to gather is recorded as
  such (``error``) and the experiment goes on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from harness.checking.invariants.gather import changes as audit_changes
from harness.contract.state_space import StateSpace, contract_space
from harness.engine.experiment import ExperimentContext
from harness.explore.cells import Sighting, observe

SAMPLES_PER_CELL = 1


def record(ctx: ExperimentContext) -> None:
    """Place the experiment's operations in cells, for its archive (``state_cells``)."""
    env = ctx.env
    try:
        ctx.flush_ops()
        trail = audit_changes(lambda q, p: env.query(q, p))
        tool = env.tool.client().export()
        unplaced: list[str] = []
        sightings = observe(
            contract_space(), trail, ctx.ops_log, tool, replication=env.replication,
            unplaced=unplaced,
        )  # fmt: skip
    except Exception as exc:
        ctx.extra["state_cells"] = {"error": f"{type(exc).__name__}: {exc}", "cells": {}}
        return
    ctx.extra["state_cells"] = summarize(sightings) | {"unplaced": unplaced_summary(unplaced)}


def summarize(sightings: Iterable[Sighting]) -> dict[str, Any]:
    counted: Counter[str] = Counter()
    samples: dict[str, list[str]] = {}
    for s in sightings:
        counted[s.cell] += 1
        mine = samples.setdefault(s.cell, [])
        if len(mine) < SAMPLES_PER_CELL:
            mine.append(f"{s.source}: {s.evidence}")
    return {"cells": dict(sorted(counted.items())), "evidence": samples}


def unplaced_summary(unplaced: list[str], samples: int = 3) -> dict[str, Any]:
    """The logged requests no cell holds, per operation: how many, and the first few."""
    by_op: dict[str, list[str]] = {}
    for line in unplaced:
        by_op.setdefault(line.split(" ", 1)[0], []).append(line)
    return {op: {"n": len(lines), "first": lines[:samples]} for op, lines in sorted(by_op.items())}


class CellCoverage:
    """The cells reached over many experiments, and by which."""

    def __init__(self, space: StateSpace | None = None) -> None:
        self.space = space or contract_space()
        self.reached: Counter[str] = Counter()
        self.first_by: dict[str, str] = {}
        self.first_after_s: dict[str, float] = {}
        #: cell id -> how many steps of the workload aimed at it
        self.aimed: Counter[str] = Counter()
        #: cell id -> why the workload could not even try it (no recipe)
        self.no_recipe: dict[str, str] = {}

    def add(self, cells: Mapping[str, int] | None, by: str, after_s: float | None = None) -> None:
        for cell, n in (cells or {}).items():
            if n <= 0:
                continue
            self.reached[cell] += n
            self.first_by.setdefault(cell, by)
            if after_s is not None:
                self.first_after_s.setdefault(cell, after_s)

    def final_after_s(self) -> float | None:
        """When the last cell reached so far was first reached (None: none was)."""
        return max(self.first_after_s.values(), default=None)

    def full_after_s(self) -> float | None:
        """When the last reachable cell was first reached (None: some never was)."""
        wanted = [c.id for c in self.space.reachable()]
        if any(c not in self.first_after_s for c in wanted):
            return None
        return max((self.first_after_s[c] for c in wanted), default=0.0)

    def not_reached(self) -> dict[str, str]:
        """Every reachable cell not reached, with the reason this campaign gives."""
        out: dict[str, str] = {}
        for c in self.space.reachable():
            if self.reached.get(c.id):
                continue
            if c.id in self.no_recipe:
                out[c.id] = self.no_recipe[c.id]
            elif self.aimed.get(c.id):
                out[c.id] = (
                    f"aimed at {self.aimed[c.id]} time(s); its state never came about "
                    "(or an observation was ambiguous) within the step's wait"
                )
            else:
                out[c.id] = "never drawn within the budget"
        return out

    def as_dict(self) -> dict[str, Any]:
        space = self.space
        reachable = [c.id for c in space.reachable()]
        got = [c for c in reachable if self.reached.get(c)]
        return {
            "cells": len(space.cells),
            "declared_unreachable": len(space.unreachable),
            "reachable": len(reachable),
            "reached": len(got),
            "full_coverage_after_s": self.full_after_s(),
            # When the campaign reached the coverage it ended with.
            "final_coverage_after_s": self.final_after_s(),
            "first_reached_after_s": {
                c: round(t, 1) for c, t in sorted(self.first_after_s.items())
            },
            "reached_cells": {c: self.reached[c] for c in sorted(self.reached)},
            "first_reached_by": dict(sorted(self.first_by.items())),
            "not_reached": self.not_reached(),
            "unreachable": dict(space.unreachable),
            # Cells no declared one matches: an operation observed in a state
            # the contract's cells leave out (or a bug the invariants judge).
            "undeclared": sorted(set(self.reached) - {c.id for c in space.cells}),
        }

    def brief(self) -> str:
        reachable = len(self.space.reachable())
        got = sum(1 for c in self.space.reachable() if self.reached.get(c.id))
        return f"{got}/{reachable} state cells"

    def table(self) -> str:
        """Markdown: one row per operation (cells, reached, declared unreachable,
        not reached), then every cell not reached with its reason."""
        lines = [
            "| operation | cells | reached | declared unreachable | not reached |",
            "|---|---|---|---|---|",
        ]
        space = self.space
        for op in dict.fromkeys(c.op for c in space.cells):
            cells = space.of(op)
            out = [c for c in cells if c.id in space.unreachable]
            got = [c for c in cells if self.reached.get(c.id) and c.id not in space.unreachable]
            missing = len(cells) - len(out) - len(got)
            lines.append(f"| {op} | {len(cells)} | {len(got)} | {len(out)} | {missing} |")
        facts = self.as_dict()
        lines += [
            "",
            f"{facts['reached']} of {facts['reachable']} reachable cells reached "
            f"({facts['cells']} cells, {facts['declared_unreachable']} declared unreachable)"
            + (
                f"; full coverage after {facts['full_coverage_after_s']:.0f} s"
                if facts["full_coverage_after_s"] is not None
                else (
                    f"; the last of them first reached after "
                    f"{facts['final_coverage_after_s']:.0f} s"
                    if facts["final_coverage_after_s"] is not None
                    else ""
                )
            ),
        ]
        missing_cells = facts["not_reached"]
        if missing_cells:
            lines += ["", "Cells not reached:", ""]
            lines += [f"- `{c}`: {why}" for c, why in sorted(missing_cells.items())]
        return "\n".join(lines)


def from_results(results: Iterable[Any]) -> CellCoverage | None:
    """The coverage of a run's experiments (their ``state_cells``); None when no
    experiment recorded any (an old run, or one interrupted early)."""
    coverage = CellCoverage()
    seen = False
    for r in results:
        cells = getattr(r, "state_cells", None)
        if cells is None:
            continue
        seen = True
        coverage.add(cells, getattr(r, "name", "?"))
    return coverage if seen else None

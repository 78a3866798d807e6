"""What ``fencecheck contract`` found: gaps, each with the section to read.

Invariants:
- a report with no gap is conformant, one with a gap is not; notes (an
  optional op a worker does not offer, an optional table it lacks) never
  make it non-conformant;
- a step that could not be taken because an earlier one failed is listed as
  skipped with the reason, never silently left out;
- every gap names the contract section, what was expected and what was
  found, as plain one-line text (newlines in found values are escaped).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.contract import CONTRACT_DOC, CONTRACT_VERSION
from harness.contract.needs import format_runs


@dataclass(frozen=True)
class Gap:
    """One way the worker differs from the contract."""

    section: str
    item: str
    expected: str
    found: str

    def line(self) -> str:
        return (
            f"[§{self.section}] {self.item}: expected {_one_line(self.expected)}; "
            f"found {_one_line(self.found)}"
        )


def _one_line(text: str, limit: int = 600) -> str:
    flat = text.replace("\r", "").replace("\n", " | ")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass(frozen=True)
class Unjudged:
    """Something an experiment needs that the worker did not show: the
    experiment runs it leaves unjudged (they end unknown, never pass)."""

    thing: str
    why: str
    runs: list[str]

    def line(self) -> str:
        return f"{self.thing}: {self.why} -> {format_runs(self.runs)}"


@dataclass
class ContractReport:
    """The outcome of one conformance check of one worker command."""

    worker: str
    gaps: list[Gap] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    unjudged: list[Unjudged] = field(default_factory=list)
    #: What the system's mapping says it lacks, with the runs that makes not
    #: applicable (never a gap, never unknown).
    not_applicable: list[Unjudged] = field(default_factory=list)
    wall_s: float = 0.0
    #: The one-paragraph account of a migrate that failed (command, exit code,
    #: last stderr lines), when it did.
    migrate_failure: str | None = None

    @property
    def conformant(self) -> bool:
        return not self.gaps

    def gap(self, section: str, item: str, expected: str, found: str) -> None:
        self.gaps.append(Gap(section, item, expected, found))

    def unjudged_runs(self) -> list[str]:
        """Every experiment run something missing leaves unjudged, once each."""
        return list(dict.fromkeys(r for u in self.unjudged for r in u.runs))

    def text(self) -> str:
        head = (
            f"fencecheck contract v{CONTRACT_VERSION}: worker `{self.worker}` ({self.wall_s:.1f} s)"
        )
        lines = [head]
        if self.migrate_failure:
            lines += ["", self.migrate_failure]
        if self.checked:
            lines += ["", "checked:", *(f"  {c}" for c in self.checked)]
        if self.notes:
            lines += ["", "notes (not gaps):", *(f"  {n}" for n in self.notes)]
        if self.skipped:
            lines += ["", "not checked:", *(f"  {s}" for s in self.skipped)]
        if self.not_applicable:
            lines += [
                "",
                f"not applicable: {len(self.not_applicable)} thing(s) the mapping declares absent "
                "(not gaps; each experiment run named is not run):",
                *(f"  {u.line()}" for u in self.not_applicable),
            ]
        if self.unjudged:
            lines += [
                "",
                f"left unjudged: {len(self.unjudged)} thing(s) the experiments need that this "
                "worker did not show (not gaps; each experiment run named ends unknown):",
                *(f"  {u.line()}" for u in self.unjudged),
            ]
        if self.gaps:
            lines += [
                "",
                f"NOT CONFORMANT: {len(self.gaps)} gap(s); read {CONTRACT_DOC} at the "
                "section named in brackets",
            ]
            lines += [f"  {i}. {g.line()}" for i, g in enumerate(self.gaps, start=1)]
        else:
            runs = self.unjudged_runs()
            apart = list(dict.fromkeys(r for u in self.not_applicable for r in u.runs))
            tail = "".join(
                (
                    f"; {len(apart)} experiment run(s) not applicable by the mapping"
                    if apart
                    else "",
                    f"; {len(runs)} experiment run(s) left unjudged (above)"
                    if runs
                    else "; every applicable experiment can be judged",
                )
            )
            lines += ["", "CONFORMANT: no gap found" + tail]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "contract_version": CONTRACT_VERSION,
            "worker": self.worker,
            "conformant": self.conformant,
            "wall_s": round(self.wall_s, 3),
            "gaps": [asdict(g) for g in self.gaps],
            "checked": self.checked,
            "notes": self.notes,
            "skipped": self.skipped,
            "unjudged": [asdict(u) for u in self.unjudged],
            "unjudged_runs": self.unjudged_runs(),
            "not_applicable": [asdict(u) for u in self.not_applicable],
            "migrate_failure": self.migrate_failure,
        }

    def write(self, directory: Path) -> tuple[Path, Path]:
        """``contract.txt`` and ``contract.json`` in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        text, data = directory / "contract.txt", directory / "contract.json"
        text.write_text(self.text() + "\n", encoding="utf-8")
        data.write_text(json.dumps(self.as_dict(), indent=2) + "\n", encoding="utf-8")
        return text, data

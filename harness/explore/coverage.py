"""What a campaign reached: injection point x fault kind, counted only where the
fault took effect (anti-vacuity: a fault drawn but never observed is listed
apart, never as covered).

Faults that are not tied to a point (pause, kill, link, tool) are counted
under the point the affected worker passed last before the fault, as the
control socket journaled it; ``(start)`` when it had passed none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from harness.explore.nemesis import Effect

NO_POINT = "(start)"


class Coverage:
    """Counts of (point, fault kind) reached, and of faults drawn but not in effect."""

    def __init__(self) -> None:
        self.reached: Counter[tuple[str, str]] = Counter()
        self.missed: Counter[str] = Counter()

    def add(self, effects: Iterable[Effect]) -> None:
        for e in effects:
            kind = e.kind if e.kind != "link" else f"link {e.label.split()[0]}"
            if not e.took_effect:
                self.missed[kind] += 1
                continue
            point = e.point or e.after_point or NO_POINT
            self.reached[(point, kind)] += 1

    def as_dict(self) -> dict[str, object]:
        return {
            "reached": [
                {"point": p, "fault": k, "count": n} for (p, k), n in sorted(self.reached.items())
            ],
            "not_in_effect": dict(sorted(self.missed.items())),
        }

    def table(self) -> str:
        """A Markdown table: one row per point, one column per fault kind."""
        if not self.reached:
            return "(no fault took effect)"
        kinds = sorted({k for _, k in self.reached})
        points = sorted({p for p, _ in self.reached})
        lines = [
            "| point | " + " | ".join(kinds) + " |",
            "|---|" + "---|" * len(kinds),
        ]
        for p in points:
            cells = [str(self.reached.get((p, k), "")) or "." for k in kinds]
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        if self.missed:
            lines.append("")
            lines.append(
                "drawn but not in effect (not counted above): "
                + ", ".join(f"{k} {n}" for k, n in sorted(self.missed.items()))
            )
        return "\n".join(lines)

    def brief(self) -> str:
        """One line for progress output."""
        return f"{len(self.reached)} point x fault cells reached"

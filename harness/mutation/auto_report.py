"""The score of a generated-mutant run, printed and written (JSON and Markdown).

Score = caught / (caught + survived): equivalent mutants (triaged, with a
reason), errors (a copy that does not import, a failed ``migrate``, every
experiment unknown) and unconfirmed catches (the catching experiment failed
against the unmutated implementation too) are reported apart and are never
counted as caught; mutants the time budget left out are listed as not run.

Invariant: every survivor in the report carries its file, line, change,
diff, the verdicts it got and the experiments that should have caught it
(from the triage file when analysed, else the ones nearest to it).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.mutation.auto import AutoOutcome, AutoRun


@dataclass(frozen=True)
class Score:
    generated: int
    selected: int
    counts: dict[str, int]
    wall_s: float
    baseline_s: float | None

    @property
    def judged(self) -> int:
        return self.counts["caught"] + self.counts["survived"]

    @property
    def rate(self) -> float | None:
        return self.counts["caught"] / self.judged if self.judged else None

    def line(self) -> str:
        c = self.counts
        rate = "n/a" if self.rate is None else f"{100 * self.rate:.1f}%"
        return (
            f"mutation score {rate}: {c['caught']} caught of {self.judged} non-equivalent "
            f"(generated {self.generated}, selected {self.selected}: caught {c['caught']}, "
            f"survived {c['survived']}, equivalent {c['equivalent']}, errors {c['error']}, "
            f"unconfirmed {c['unconfirmed']}, not run {c['not_run']}) in {self.wall_s:.0f}s"
            + (f" (baseline {self.baseline_s:.0f}s)" if self.baseline_s is not None else "")
        )


def score(generated: int, run: AutoRun) -> Score:
    counts: Counter[str] = Counter(o.status for o in run.outcomes)
    statuses = ("caught", "survived", "equivalent", "error", "unconfirmed", "not_run")
    return Score(
        generated=generated,
        selected=len(run.outcomes),
        counts={s: counts.get(s, 0) for s in statuses},
        wall_s=run.wall_s,
        baseline_s=run.baseline_s,
    )


def _entry(o: AutoOutcome, diff: str) -> dict[str, Any]:
    return {
        **o.mutant.as_dict(),
        "status": o.status,
        "caught_by": o.caught_by,
        "detail": o.detail,
        "note": o.note,
        "wall_s": round(o.wall_s, 2),
        "verdicts": o.verdicts,
        "should_be_caught_by": o.suggested,
        "diff": diff if o.status in ("survived", "error") else None,
    }


def diff_of(repo_root: Path, o: AutoOutcome) -> str:
    return o.mutant.diff((repo_root / o.mutant.path).read_text(encoding="utf-8"))


def survivors_text(repo_root: Path, outcomes: Sequence[AutoOutcome]) -> str:
    """Every survivor with where it is, what it changes and who should catch it."""
    blocks: list[str] = []
    for o in outcomes:
        if o.status != "survived":
            continue
        who = o.note or (
            "not analysed yet; the experiments nearest to it: " + ", ".join(o.suggested)
        )
        blocks.append(
            f"SURVIVED {o.mutant.id}\n  {o.mutant.path}:{o.mutant.line}  {o.mutant.describe()}\n"
            f"  {who}\n  verdicts: "
            + ", ".join(f"{k}={v}" for k, v in o.verdicts.items())
            + "\n"
            + "".join(f"    {line}\n" for line in diff_of(repo_root, o).splitlines())
        )
    return "\n".join(blocks)


def write(
    report_dir: Path, repo_root: Path, s: Score, outcomes: Sequence[AutoOutcome], stale: list[str]
) -> tuple[Path, Path]:
    """``automutants.json`` and ``automutants.md`` in ``report_dir``."""
    json_path = report_dir / "automutants.json"
    md_path = report_dir / "automutants.md"
    data = {
        "score": s.rate,
        "summary": s.line(),
        "generated": s.generated,
        "selected": s.selected,
        "counts": s.counts,
        "wall_s": round(s.wall_s, 1),
        "baseline_s": None if s.baseline_s is None else round(s.baseline_s, 1),
        "stale_triage_entries": stale,
        "mutants": [
            _entry(o, diff_of(repo_root, o) if o.status in ("survived", "error") else "")
            for o in outcomes
        ],
    }
    json_path.write_text(json.dumps(data, indent=2))
    lines = ["# Generated mutants", "", s.line(), ""]
    if stale:
        lines += ["## Stale triage entries (no such mutant any more)", ""]
        lines += [f"- `{i}`" for i in stale] + [""]
    lines += ["## Survivors", ""]
    for o in outcomes:
        if o.status != "survived":
            continue
        lines += [
            f"### `{o.mutant.id}`",
            "",
            f"- where: `{o.mutant.path}:{o.mutant.line}` ({o.mutant.scope})",
            f"- change: {o.mutant.describe()}",
            f"- should be caught by: {o.note or ', '.join(o.suggested) + ' (nearest; not analysed)'}",
            "- verdicts: " + ", ".join(f"{k}={v}" for k, v in o.verdicts.items()),
            "",
            "```diff",
            diff_of(repo_root, o).rstrip(),
            "```",
            "",
        ]
    sections = (
        ("Errors", "error"),
        ("Unconfirmed catches (rerun them on a quieter machine)", "unconfirmed"),
        ("Equivalent", "equivalent"),
        ("Caught", "caught"),
        ("Not run", "not_run"),
    )
    for title, status in sections:
        chosen = [o for o in outcomes if o.status == status]
        if not chosen:
            continue
        lines += [f"## {title} ({len(chosen)})", ""]
        for o in chosen:
            extra = ",".join(o.caught_by) if status == "caught" else (o.note or o.detail)
            extra = extra.splitlines()[0][:300] if extra else ""
            lines.append(f"- `{o.mutant.id}` ({o.mutant.path}:{o.mutant.line}): {extra}")
        lines.append("")
    md_path.write_text("\n".join(lines))
    return json_path, md_path

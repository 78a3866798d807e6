"""What changed between two runs, from their archives alone.

Compares per experiment (and variant): the verdicts of all its repetitions,
and the run-level facts (worker digest and command, PostgreSQL version and
binaries, commit, backend, mutant, seed, versions). A *regression* is an
experiment that passed every time in the first run and did not in the
second; an experiment missing from the second run is listed, not counted as
a regression (a run of a subset is legitimate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.evidence.html.markup import Markup, el, table
from harness.evidence.run_dir import Entry, load_entries, run_facts
from harness.verdict import Verdict


@dataclass(frozen=True)
class Change:
    experiment: str
    before: str
    after: str
    regression: bool
    reason: str


@dataclass
class Comparison:
    a: Path
    b: Path
    fact_changes: list[tuple[str, str, str]] = field(default_factory=list)
    same_facts: list[tuple[str, str]] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    unchanged: list[tuple[str, str]] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]


def _verdicts(entries: Sequence[Entry]) -> dict[str, list[Entry]]:
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.group, []).append(e)
    return groups


def verdict_text(group: Sequence[Entry]) -> str:
    """'pass' for one run; '18 pass, 2 fail' over repetitions."""
    if len(group) == 1:
        return group[0].verdict.value
    counts = {v: sum(e.verdict is v for e in group) for v in Verdict}
    return ", ".join(f"{n} {v.value}" for v, n in counts.items() if n)


def compare_runs(a: Path, b: Path) -> Comparison:
    """Compare the run in ``a`` (before) with the run in ``b`` (after)."""
    entries_a, entries_b = load_entries(a), load_entries(b)
    result = Comparison(a=a, b=b)
    facts_a, facts_b = run_facts(entries_a), run_facts(entries_b)
    for name in dict.fromkeys([*facts_a, *facts_b]):
        va = ", ".join(facts_a.get(name, ["not recorded"]))
        vb = ", ".join(facts_b.get(name, ["not recorded"]))
        if va == vb:
            result.same_facts.append((name, va))
        else:
            result.fact_changes.append((name, va, vb))
    groups_a, groups_b = _verdicts(entries_a), _verdicts(entries_b)
    for name, group_a in groups_a.items():
        group_b = groups_b.get(name)
        if group_b is None:
            result.only_a.append(name)
            continue
        before, after = verdict_text(group_a), verdict_text(group_b)
        if before == after:
            result.unchanged.append((name, before))
            continue
        passed_before = all(e.verdict is Verdict.PASS for e in group_a)
        passed_after = all(e.verdict is Verdict.PASS for e in group_b)
        reasons = [e.reason for e in group_b if e.verdict is not Verdict.PASS]
        result.changes.append(
            Change(
                name,
                before,
                after,
                passed_before and not passed_after,
                reasons[0] if reasons else "",
            )
        )
    result.only_b = [name for name in groups_b if name not in groups_a]
    return result


def comparison_lines(c: Comparison) -> list[str]:
    lines = [f"before: {c.a}", f"after:  {c.b}", "", "run facts:"]
    for name, va, vb in c.fact_changes:
        lines.append(f"  {name}: CHANGED\n    before: {va}\n    after:  {vb}")
    for name, value in c.same_facts:
        lines.append(f"  {name}: same ({value})")
    lines.append("")
    lines.append(
        f"verdicts: {len(c.unchanged)} experiment(s) unchanged, {len(c.changes)} changed, "
        f"{len(c.regressions)} regression(s)"
    )
    for ch in c.changes:
        mark = "REGRESSION " if ch.regression else ""
        why = f"  ({ch.reason})" if ch.reason else ""
        lines.append(f"  {mark}{ch.experiment}: {ch.before} → {ch.after}{why}")
    if c.only_a:
        lines.append(f"only in before: {', '.join(c.only_a)}")
    if c.only_b:
        lines.append(f"only in after: {', '.join(c.only_b)}")
    return lines


def comparison_page(c: Comparison) -> str:
    from harness.evidence.html.pages import page

    facts = table(
        ("fact", "before", "after"),
        [
            *([Markup(el("strong", n)), va, vb] for n, va, vb in c.fact_changes),
            *([n, v, "same"] for n, v in c.same_facts),
        ],
    )
    verdicts = table(
        ("experiment", "before", "after", "regression", "reason after"),
        [
            *(
                [
                    ch.experiment,
                    ch.before,
                    ch.after,
                    "REGRESSION" if ch.regression else "",
                    ch.reason,
                ]
                for ch in c.changes
            ),
            *([n, v, v, "", "unchanged"] for n, v in c.unchanged),
            *([n, "ran", "not run", "", ""] for n in c.only_a),
            *([n, "not run", "ran", "", ""] for n in c.only_b),
        ],
    )
    return page(
        "fencecheck: compare runs",
        el("h1", "What changed between two runs"),
        el("p", f"before: {c.a}", el("br"), f"after: {c.b}", class_="mono"),
        el("h2", f"Verdicts ({len(c.changes)} changed, {len(c.regressions)} regressions)"),
        verdicts,
        el("h2", f"Run facts ({len(c.fact_changes)} changed)"),
        facts,
    )

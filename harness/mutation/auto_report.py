"""The report of a generated-mutant campaign: ``results.json``, ``summary.md``
and ``index.html`` in its report folder, sealed by ``MANIFEST.sha256``.

Score = caught / (caught + survived): equivalent mutants (triaged, with a
reason), errors (a copy that does not import, a failed ``migrate``, every
experiment unknown) and unconfirmed catches (the catching experiment failed
against the unmutated implementation too) are reported apart and are never
counted as caught; mutants the time budget left out are listed as not run.
For a sample, the score comes with a 95% Wilson interval: the sample is
drawn proportionally from every (file, operator) stratum
(:func:`catalog.stratified_sample`), so its caught fraction estimates the
whole set's.

Everything is built from the run's journal (``outcomes.jsonl``, one line per
mutant as it finished) and ``run.json`` (how it was started), so
:func:`rebuild` makes the same report again later, with the triage file as it
is then (a survivor analysed as equivalent after the run moves to equivalent,
its reason shown).

Invariant: every survivor in the report carries its file, line, change,
diff, the verdicts it got and the experiments that should have caught it
(from the triage file when analysed, else the ones nearest to it).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.evidence import bounded_read
from harness.mutation.auto import JOURNAL, RUN_FILE
from harness.mutation.triage import Triage

STATUSES = ("caught", "survived", "equivalent", "error", "unconfirmed", "not_run")
RESULTS = "results.json"
SUMMARY = "summary.md"
Z95 = 1.959964


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion (95% by default); None for n = 0."""
    if n == 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass(frozen=True)
class Score:
    generated: int
    counts: dict[str, int]
    walls: list[float]  # seconds of every mutant that ran

    @property
    def selected(self) -> int:
        return sum(self.counts.values())

    @property
    def judged(self) -> int:
        return self.counts["caught"] + self.counts["survived"]

    @property
    def rate(self) -> float | None:
        return self.counts["caught"] / self.judged if self.judged else None

    @property
    def interval(self) -> tuple[float, float] | None:
        return wilson(self.counts["caught"], self.judged)

    @property
    def rate_unconfirmed_as_survived(self) -> float | None:
        n = self.judged + self.counts["unconfirmed"]
        return self.counts["caught"] / n if n else None

    def times(self) -> dict[str, float | None]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 1)

        mean = statistics.fmean(self.walls) if self.walls else None
        return {
            "median_s": r(percentile(self.walls, 50)),
            "p90_s": r(percentile(self.walls, 90)),
            "mean_s": r(mean),
            "max_s": r(max(self.walls) if self.walls else None),
        }

    def line(self) -> str:
        c = self.counts
        if self.rate is None:
            rate = "n/a"
        else:
            lo, hi = self.interval or (0.0, 0.0)
            rate = f"{100 * self.rate:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}%)"
        return (
            f"mutation score {rate}: {c['caught']} caught of {self.judged} non-equivalent "
            f"(generated {self.generated}, selected {self.selected}: caught {c['caught']}, "
            f"survived {c['survived']}, equivalent {c['equivalent']}, errors {c['error']}, "
            f"unconfirmed {c['unconfirmed']}, not run {c['not_run']})"
        )


def score(generated: int, entries: Sequence[Mapping[str, Any]]) -> Score:
    counts: Counter[str] = Counter(str(e["status"]) for e in entries)
    # Every mutant that ran, also one triaged equivalent after its run (a
    # triaged-equivalent mutant that was not run took 0 s).
    walls = [float(e["wall_s"]) for e in entries if e["status"] != "not_run" and e["wall_s"] > 0]
    return Score(generated, {s: counts.get(s, 0) for s in STATUSES}, walls)


def apply_triage(entries: Sequence[dict[str, Any]], judged: Triage) -> None:
    """The triage file as it is now, over a run's entries: a survivor triaged
    equivalent since becomes ``equivalent`` (kept: ``status_in_run``); notes
    say what the triage file says (or where it contradicts the run)."""
    for e in entries:
        mid, status = e["id"], e["status"]
        if mid in judged.equivalent:
            if status == "survived":
                e["status_in_run"] = status
                e["status"] = "equivalent"
                e["note"] = judged.equivalent[mid]
            elif status == "caught":
                e["note"] = "the triage file calls it equivalent, but the matrix caught it"
            else:
                e["note"] = judged.equivalent[mid]
        elif mid in judged.survivors:
            s = judged.survivors[mid]
            if status == "caught":
                e["note"] = "the triage file lists it as a survivor, but the matrix caught it"
            else:
                e["note"] = f"breaks: {s.breaks}; should be caught by: {s.should_catch}"


def read_journal(report_dir: Path) -> list[dict[str, Any]]:
    path = report_dir / JOURNAL
    if not path.exists():
        return []
    text = bounded_read.read_text(path)
    return [bounded_read.parse_json(line, path) for line in text.splitlines() if line.strip()]


def by_group(entries: Sequence[Mapping[str, Any]], key: str) -> dict[str, dict[str, int]]:
    """Counts of every status per value of ``key`` (language, path, operator)."""
    table: dict[str, Counter[str]] = {}
    for e in entries:
        table.setdefault(str(e[key]), Counter())[str(e["status"])] += 1
    return {k: {s: v[s] for s in STATUSES if v[s]} for k, v in sorted(table.items())}


def results(run: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The content of ``results.json``."""
    s = score(int(run["generated"]), entries)
    ci = s.interval
    return {
        "kind": "automutants",
        "run": dict(run),
        "summary": s.line(),
        "generated": s.generated,
        "selected": s.selected,
        "counts": s.counts,
        "score": s.rate,
        "score_ci95": None if ci is None else [round(ci[0], 4), round(ci[1], 4)],
        "score_ci_method": "Wilson score interval over caught / (caught + survived) of a "
        "sample drawn proportionally per (file, operator); no finite-population correction "
        "(slightly wide)",
        "score_if_unconfirmed_survived": s.rate_unconfirmed_as_survived,
        "time_per_mutant": s.times(),
        "by_language": by_group(entries, "language"),
        "by_file": by_group(entries, "path"),
        "by_operator": by_group(entries, "operator"),
        "mutants": list(entries),
    }


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def summary_md(data: Mapping[str, Any]) -> str:
    """``summary.md``: the figures first, then every mutant by status."""
    run, counts, t = data["run"], data["counts"], data["time_per_mutant"]
    entries: list[Mapping[str, Any]] = data["mutants"]
    ci = data["score_ci95"]
    lines = [
        "# Generated mutants (`fencecheck mutants --auto`)",
        "",
        f"`{run.get('command', '')}`",
        "",
        "| figure | value |",
        "|---|---|",
        f"| generated (whole set) | {data['generated']} |",
        f"| selected | {data['selected']} (sample {run.get('sample')}, seed {run.get('seed')}, "
        "stratified by file and operator) |",
        *(f"| {s.replace('_', ' ')} | {counts[s]} |" for s in STATUSES),
        f"| **score** caught / (caught + survived) | **{_pct(data['score'])}** |",
        "| 95% interval for the whole set (Wilson) | "
        + ("n/a" if ci is None else f"{100 * ci[0]:.1f}% - {100 * ci[1]:.1f}%")
        + " |",
        f"| score if unconfirmed catches were survivors | "
        f"{_pct(data['score_if_unconfirmed_survived'])} |",
        f"| time per mutant run: median / p90 / mean / max | {t['median_s']} / {t['p90_s']} / "
        f"{t['mean_s']} / {t['max_s']} s |",
        f"| wall time (baseline) | {run.get('wall_s')} s ({run.get('baseline_s')} s) |",
        f"| experiments at once / mutants at once | {run.get('jobs')} / "
        f"{run.get('mutants_at_once')} |",
        f"| load average at start / end | {run.get('load_start')} / {run.get('load_end')} |",
        f"| commit | {run.get('commit')} |",
        "",
        "Only a *fail* verdict counts as caught, and a catch counts only when the same "
        "experiment passes against the unmutated implementation (confirmed). Errors and "
        "unconfirmed catches are never counted as caught; equivalents carry their reason "
        "from `reference_impl/mutants/equivalent.yaml`.",
        "",
    ]
    if run.get("stale_triage_entries"):
        lines += ["## Stale triage entries (no such mutant any more)", ""]
        lines += [f"- `{i}`" for i in run["stale_triage_entries"]] + [""]
    lines += ["## By file", "", "| file | " + " | ".join(STATUSES) + " |"]
    lines.append("|---" * (len(STATUSES) + 1) + "|")
    for path, c in data["by_file"].items():
        lines.append(f"| `{path}` | " + " | ".join(str(c.get(s, 0)) for s in STATUSES) + " |")
    lines += ["", f"## Survivors ({counts['survived']})", ""]
    for e in entries:
        if e["status"] != "survived":
            continue
        who = e.get("note") or (
            ", ".join(e.get("should_be_caught_by") or []) + " (nearest; not analysed)"
        )
        lines += [
            f"### `{e['id']}`",
            "",
            f"- where: `{e['path']}:{e['line']}` ({e['scope']})",
            f"- change: {e['change']}",
            f"- {who}",
            "- verdicts: " + ", ".join(f"{k}={v}" for k, v in e["verdicts"].items()),
            "",
            "```diff",
            str(e.get("diff") or "").rstrip(),
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
        chosen = [e for e in entries if e["status"] == status]
        if not chosen:
            continue
        lines += [f"## {title} ({len(chosen)})", ""]
        for e in chosen:
            if status == "caught":
                extra = f"caught by {','.join(e['caught_by'])} in {e['wall_s']} s"
            else:
                extra = str(e.get("note") or e.get("detail") or "")
                extra = extra.splitlines()[0][:300] if extra else ""
            lines.append(f"- `{e['id']}` (`{e['path']}:{e['line']}`): {extra}")
        lines.append("")
    return "\n".join(lines)


def write(report_dir: Path, run: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> Path:
    """``results.json`` and ``summary.md``; returns the summary's path."""
    data = results(run, entries)
    (report_dir / RESULTS).write_text(json.dumps(data, indent=2) + "\n")
    path = report_dir / SUMMARY
    path.write_text(summary_md(data) + "\n")
    return path


def publish(report_dir: Path, *, pages: bool = True) -> str:
    """The HTML index (and each mutant's run pages), then the seal, last."""
    from harness.evidence.html.automutants import write_automutants_pages
    from harness.evidence.manifest import run_digest, write_manifest

    lines = []
    try:
        lines.append(f"pages: {write_automutants_pages(report_dir, run_pages=pages)}")
    except Exception as exc:  # the score stands on results.json; say why pages are missing
        lines.append(f"pages NOT WRITTEN ({type(exc).__name__}: {exc})")
    write_manifest(report_dir)
    lines.append(f"evidence digest {run_digest(report_dir)} (fencecheck verify {report_dir})")
    return "\n".join(lines)


def rebuild(
    report_dir: Path, judged: Triage, diffs: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The report again from ``run.json`` and the journal, with the triage file
    as it is now; ``diffs`` fills in the diff of an entry that has none (an id
    of the current code). Returns the results."""
    run = bounded_read.load_json(report_dir / RUN_FILE)
    entries = read_journal(report_dir)
    for e in entries:
        if not e.get("diff") and diffs and e["id"] in diffs:
            e["diff"] = diffs[e["id"]]
    apply_triage(entries, judged)
    write(report_dir, run, entries)
    return results(run, entries)


def survivors_text(entries: Sequence[Mapping[str, Any]]) -> str:
    """Every survivor with where it is, what it changes and who should catch it."""
    blocks: list[str] = []
    for e in entries:
        if e["status"] != "survived":
            continue
        who = e.get("note") or (
            "not analysed yet; the experiments nearest to it: "
            + ", ".join(e.get("should_be_caught_by") or [])
        )
        blocks.append(
            f"SURVIVED {e['id']}\n  {e['path']}:{e['line']}  {e['change']}\n"
            f"  {who}\n  verdicts: "
            + ", ".join(f"{k}={v}" for k, v in e["verdicts"].items())
            + "\n"
            + "".join(f"    {line}\n" for line in str(e.get("diff") or "").splitlines())
        )
    return "\n".join(blocks)

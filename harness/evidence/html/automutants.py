"""The index of a ``fencecheck mutants --auto`` folder: the score and one row
per generated mutant (its verdict, the experiment that caught it, or why it
was not), linking to the pages of the runs that judged it.

Built from ``results.json`` (what the command decided) and each mutant's own
run folder (``mutants/<slug>/archives``, and ``confirm/attempt-N`` where the
catch was rerun against the unmutated implementation), whose pages
:func:`write_run_pages` writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.evidence import bounded_read, manifest
from harness.evidence.html import write_run_pages
from harness.evidence.html.markup import Markup, el, thead
from harness.evidence.html.pages import verdict_badge, write_index
from harness.evidence.run_dir import NotARunDirectory
from harness.mutation.workspace import slug
from harness.verdict import Verdict

# What each status means for the harness (a caught mutant is the harness passing).
_STYLE = {
    "caught": (Verdict.PASS, "✓ caught"),
    "survived": (Verdict.FAIL, "✗ SURVIVED"),
    "unconfirmed": (Verdict.UNKNOWN, "? unconfirmed"),
    "error": (Verdict.UNKNOWN, "! error"),
    "equivalent": (Verdict.PASS, "= equivalent"),
    "not_run": (Verdict.UNKNOWN, "- not run"),
}


def _badge(status: str) -> Markup:
    verdict, words = _STYLE.get(status, (Verdict.UNKNOWN, status))
    return el("span", words, class_=f"verdict verdict-{verdict.value}", data_verdict=verdict.value)


def _pages(folder: Path, mutant_id: str, run_pages: bool) -> Markup:
    """Links to the mutant's run pages (written here) and its confirmation runs."""
    sub = folder / "mutants" / slug(mutant_id)
    if not sub.is_dir():
        return el("span", "not run", class_="muted")
    links: list[Markup] = []
    targets = [(sub, "runs")] + [
        (attempt, f"confirm {attempt.name.removeprefix('attempt-')}")
        for attempt in sorted((sub / "confirm").glob("attempt-*"))
    ]
    for run_dir, words in targets:
        try:
            if run_pages:
                write_run_pages(run_dir, title=f"generated mutant {mutant_id} ({words})")
        except NotARunDirectory:
            continue
        if (run_dir / "index.html").is_file():
            links.append(el("a", words, href=f"{run_dir.relative_to(folder)}/index.html"))
    return el("span", *links) if links else el("span", "no archives", class_="muted")


def write_automutants_pages(folder: Path, *, run_pages: bool = True) -> Path:
    """``folder/index.html`` from ``results.json`` (and, with ``run_pages``, the
    pages of every mutant's runs); returns the index's path."""
    data: dict[str, Any] = bounded_read.load_json(folder / "results.json")
    entries: list[dict[str, Any]] = data.get("mutants", [])
    rows = []
    for e in entries:
        status = str(e["status"])
        why = (
            ", ".join(e.get("caught_by") or [])
            if status == "caught"
            else str(e.get("note") or e.get("detail") or "")
        )
        rows.append(
            el(
                "tr",
                el("td", _badge(status)),
                el("td", el("code", e["id"])),
                el("td", f"{e['path']}:{e['line']}"),
                el("td", el("code", e["change"])),
                el("td", why[:400]),
                el("td", f"{e['wall_s']} s"),
                el("td", _pages(folder, e["id"], run_pages)),
                class_=f"row-{_STYLE.get(status, (Verdict.UNKNOWN, ''))[0].value}",
                data_mutant=e["id"],
                data_status=status,
            )
        )
    counts = data["counts"]
    overall = Verdict.PASS if counts["survived"] == 0 and data["score"] else Verdict.FAIL
    ci = data.get("score_ci95")
    t = data["time_per_mutant"]
    digest = manifest.run_digest(folder)
    body = [
        el("h1", verdict_badge(overall), f"fencecheck mutants --auto {folder.resolve().name}"),
        el("p", data["summary"]),
        el(
            "p",
            "95% interval for the whole set: "
            + ("n/a" if ci is None else f"{100 * ci[0]:.1f}% to {100 * ci[1]:.1f}%")
            + f"; time per mutant: median {t['median_s']} s, p90 {t['p90_s']} s. "
            "Only a confirmed fail counts as caught; errors and unconfirmed catches never do; "
            "equivalents carry their reason. summary.md and results.json hold every figure.",
        ),
        el(
            "table",
            thead(("verdict", "mutant", "where", "change", "caught by / why", "time", "pages")),
            el("tbody", rows),
            class_="experiments",
        ),
        el("p", "evidence digest ", el("span", digest, class_="digest"), class_="note"),
    ]
    return write_index(
        folder / "index.html",
        f"mutants --auto {data['summary'].split(':')[0]}",
        body,
        built_from="results.json and each mutant's archives",
        verdict=overall,
        digest=digest,
    )

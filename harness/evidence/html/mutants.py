"""The index of a ``fencecheck mutants`` folder: one row per mutant, linking
to the pages of the runs that tried to catch it.

Built from ``mutants.json`` (what the command decided) and each mutant's own
run folder (``<mutant>/archives``), whose pages :func:`write_run_pages` writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.evidence import bounded_read, manifest
from harness.evidence.html import write_run_pages
from harness.evidence.html.markup import el, thead
from harness.evidence.html.pages import verdict_badge, write_index
from harness.evidence.run_dir import NotARunDirectory
from harness.verdict import Verdict


def _caught_badge(caught: bool) -> Any:
    verdict = Verdict.PASS if caught else Verdict.FAIL
    words = "✓ caught" if caught else "✗ NOT CAUGHT"
    return el("span", words, class_=f"verdict verdict-{verdict.value}", data_verdict=verdict.value)


def write_mutants_pages(folder: Path, *, run_pages: bool = True) -> Path:
    """Pages for every mutant's run folder (unless ``run_pages`` is False: then
    the index says how to build them), then ``folder/index.html``; returns it."""
    outcomes: list[dict[str, Any]] = []
    listing = folder / "mutants.json"
    if listing.exists():
        loaded = bounded_read.load_json(listing)
        outcomes = [o for o in loaded if isinstance(o, dict)] if isinstance(loaded, list) else []
    rows = []
    for o in outcomes:
        name = str(o.get("mutant"))
        sub = folder / name
        link = None
        try:
            if run_pages:
                write_run_pages(sub, title=f"mutant {name}")
                link = el("a", "runs", href=f"{name}/index.html")
            else:
                link = el("span", f"not built: fencecheck report {folder}", class_="muted")
        except NotARunDirectory:
            link = el("span", "no archives", class_="muted")
        caught = bool(o.get("caught_by"))
        # Caught is what the command wants: styled as a pass of the harness.
        verdict = Verdict.PASS if caught else Verdict.FAIL
        rows.append(
            el(
                "tr",
                el("td", _caught_badge(caught)),
                el("td", name),
                el("td", str(o.get("rule"))),
                el("td", ", ".join(map(str, o.get("expected") or []))),
                el("td", _caught_text(o)),
                el("td", str(o.get("detail", ""))),
                el("td", link),
                class_=f"row-{verdict.value}",
                data_mutant=name,
                data_verdict=verdict.value,
            )
        )
    score = sum(bool(o.get("caught_by")) for o in outcomes)
    overall = Verdict.PASS if outcomes and score == len(outcomes) else Verdict.FAIL
    digest = manifest.run_digest(folder)
    head = thead(
        (
            "caught",
            "mutant",
            "rule",
            "expected catchers",
            "caught by",
            "detail",
            "pages",
        )
    )
    body = [
        el("h1", verdict_badge(overall), f"fencecheck mutants {folder.resolve().name}"),
        el(
            "p",
            f"mutation score {score}/{len(outcomes)}: each mutant breaks one protocol rule; only "
            "a fail of some experiment counts as caught (an unknown proves nothing).",
        ),
        el("table", head, el("tbody", rows), class_="experiments"),
        el("p", "evidence digest ", el("span", digest, class_="digest"), class_="note"),
    ]
    return write_index(
        folder / "index.html",
        f"mutants {score}/{len(outcomes)}",
        body,
        built_from="mutants.json and each mutant's archives",
        verdict=overall,
        digest=digest,
    )


def _caught_text(outcome: dict[str, Any]) -> str:
    """Who caught it, or why nobody counts as having caught it."""
    by: list[Any] = outcome.get("caught_by") or []
    unconfirmed: list[Any] = outcome.get("unconfirmed_catch_by") or []
    if by:
        return ", ".join(map(str, by))
    if unconfirmed:
        return "UNCONFIRMED (" + ", ".join(map(str, unconfirmed)) + ")"
    return "NOT CAUGHT"

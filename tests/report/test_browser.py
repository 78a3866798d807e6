"""The pages in a real browser: headless Chromium (Debian's `chromium`; `make
browser` installs it) opens every page with the network switched off, takes a
screenshot of each, and the DOM must hold every experiment row, every lane and
every fault span of the archives; verdicts must differ with and without
colour; no console error, no request leaves the disk; no browser is left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.evidence.archive import validate
from harness.evidence.html import write_run_pages
from harness.parts.chromium import Chromium, ChromiumNotFound, Page, find_chromium, group_members
from tests.report.conftest import load
from tests.report.expect import expected_fault_spans, expected_lanes


def test_chromium_is_there() -> None:
    """Not skipped when missing: the rendering tests would prove nothing."""
    try:
        find_chromium()
    except ChromiumNotFound as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    try:
        chromium = Chromium()
    except ChromiumNotFound as exc:
        pytest.fail(str(exc))
    with chromium:
        yield chromium
    assert chromium.pid is not None
    assert group_members(chromium.pid) == [], "a chromium process was left behind"


def open_page(tab: Page, path: Path, shot: Path) -> None:
    """Load offline; no console error; every request is the file itself."""
    loaded = tab.load(path.resolve().as_uri())
    assert loaded.console_errors == [], (path.name, loaded.console_errors)
    assert loaded.failed_requests == [], (path.name, loaded.failed_requests)
    assert all(u.startswith("file://") for u in loaded.requests), loaded.requests
    assert tab.screenshot(shot, max_height=4000).stat().st_size > 5000


def js(tab: Page, expression: str) -> Any:
    return tab.evaluate(expression)


@pytest.mark.slow
def test_every_page_renders_with_all_rows_lanes_and_fault_spans(
    browser: Chromium, run_mixed: Path, run_pass: Path, run_fail: Path, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    tab = browser.new_page(offline=True)
    for run in (run_mixed, run_pass, run_fail):
        index = write_run_pages(run)
        open_page(tab, index, shots / f"{run.name}-index.png")
        labels = js(
            tab,
            "[...document.querySelectorAll('tr[data-experiment]')].map(r => r.dataset.experiment)",
        )
        assert sorted(labels) == sorted(p.stem for p in (run / "archives").glob("*.yaml"))
        for archive_path in sorted((run / "archives").glob("*.yaml")):
            page = run / "experiments" / f"{archive_path.stem}.html"
            open_page(tab, page, shots / f"{run.name}-{archive_path.stem}.png")
            try:
                archive = load(archive_path)
                validate(archive)
            except Exception:
                # Not YAML, or fails the published schema: its page says it is
                # unreadable and draws nothing from it (test_pages checks the text).
                assert js(tab, "document.querySelectorAll('g.lane').length") == 0
                continue
            lanes = js(tab, "[...document.querySelectorAll('g.lane')].map(g => g.dataset.lane)")
            assert set(lanes) == expected_lanes(archive), archive_path
            faults = js(
                tab, "[...document.querySelectorAll('[data-fault]')].map(e => e.dataset.fault)"
            )
            want = expected_fault_spans(archive)
            assert {k: faults.count(k) for k in want} == want, archive_path
            # Each fault span really has a size on screen.
            sizes = js(
                tab,
                "[...document.querySelectorAll('[data-fault] rect')]"
                ".map(r => r.getBoundingClientRect()).map(b => b.width * b.height)",
            )
            assert all(s > 0 for s in sizes), sizes
    assert len(list(shots.glob("*.png"))) == 3 + 5 + 2 + 2


VERDICT_STYLE = """[...document.querySelectorAll('tr[data-experiment] .verdict')].map(e => {
  const s = getComputedStyle(e);
  return {verdict: e.dataset.verdict, text: e.textContent.trim(), border: s.borderTopStyle,
          width: s.borderTopWidth, font: s.fontStyle, transform: s.textTransform,
          colour: s.color + '/' + s.backgroundColor};
})"""


@pytest.mark.slow
def test_verdicts_differ_with_and_without_colour(browser: Chromium, run_mixed: Path) -> None:
    tab = browser.new_page(offline=True)
    tab.load(write_run_pages(run_mixed).resolve().as_uri())
    styles = js(tab, VERDICT_STYLE)
    by_verdict: dict[str, dict[str, str]] = {}
    for s in styles:
        by_verdict.setdefault(s["verdict"], s)
    assert set(by_verdict) == {"pass", "fail", "unknown"}
    shapes = {v: (s["text"][0], s["border"], s["font"]) for v, s in by_verdict.items()}
    colours = {v: s["colour"] for v, s in by_verdict.items()}
    assert len(set(shapes.values())) == 3, f"without colour two verdicts look alike: {shapes}"
    assert len(set(colours.values())) == 3, colours
    # Seen through achromatopsia the glyph and the frame still tell them apart.
    tab.call("Emulation.setEmulatedVisionDeficiency", {"type": "achromatopsia"})
    again = js(tab, VERDICT_STYLE)
    assert json.dumps(again, sort_keys=True) == json.dumps(styles, sort_keys=True)


@pytest.mark.slow
def test_the_checks_catch_a_page_that_reaches_out(browser: Chromium, tmp_path: Path) -> None:
    """Control: a page that loads something from the network fails these checks."""
    page = tmp_path / "reaches-out.html"
    page.write_text(
        '<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png"/>'
        "<script>console.error('boom')</script></body></html>"
    )
    loaded = browser.new_page(offline=True).load(page.resolve().as_uri())
    assert loaded.failed_requests and loaded.console_errors
    assert not all(u.startswith("file://") for u in loaded.requests)

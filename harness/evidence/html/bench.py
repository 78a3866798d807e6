"""Figures for the pages: size, build time, and render time in headless Chromium.

    python -m harness.evidence.html.bench REPORT_DIR [REPORT_DIR ...]
    python -m harness.evidence.html.bench --shot PAGE.html OUT.png [--element CSS] [--until CSS]

For each run folder: the time ``write_run_pages`` takes (into a temporary
folder; the run is not touched), the size of the index and of every
experiment page, and the time Chromium takes to load each page from disk with
the network off (wall time from navigation to the load event, and the page's
own load time). Prints figures, asserts nothing: a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness.evidence.html import write_run_pages
from harness.parts.chromium import Chromium


def _kib(n: float) -> str:
    return f"{n / 1024:.0f} KiB"


def measure(run: Path, browser: Chromium) -> None:
    with tempfile.TemporaryDirectory(prefix="fencecheck-bench-") as tmp:
        out = Path(tmp)
        started = time.perf_counter()
        index = write_run_pages(run, out)
        build_s = time.perf_counter() - started
        pages = sorted((out / "experiments").glob("*.html"))
        sizes = {p.name: p.stat().st_size for p in pages}
        index_size = index.stat().st_size
        tab = browser.new_page(offline=True)
        loads: dict[str, tuple[float, float]] = {}
        for path in [index, *pages]:
            result = tab.load(path.resolve().as_uri())
            if result.console_errors:
                print(f"  console errors on {path.name}: {result.console_errors}")
            loads[path.name] = (result.load_ms, tab.timing().get("load", -1.0))
        tab.close()
    walls = [loads[name][0] for name in sizes]
    biggest = max(sizes, key=lambda name: sizes[name])
    print(f"{run}:")
    print(f"  pages built in {build_s:.2f} s ({len(pages)} experiment pages + index)")
    print(
        f"  index: {_kib(index_size)}, loaded in {loads['index.html'][0]:.0f} ms "
        f"(the page's own load event at {loads['index.html'][1]:.0f} ms)"
    )
    print(
        f"  experiment pages: total {_kib(sum(sizes.values()))}, median "
        f"{_kib(statistics.median(sizes.values()))}, biggest {biggest} {_kib(sizes[biggest])}"
    )
    print(
        f"  load (navigation to load event): median {statistics.median(walls):.0f} ms, "
        f"max {max(walls):.0f} ms; biggest page {loads[biggest][0]:.0f} ms "
        f"(its own load event at {loads[biggest][1]:.0f} ms)"
    )


def shot(page: Path, out: Path, *, element: str | None, until: str | None) -> None:
    """A PNG of a page (the docs' screenshots): from the top of ``element`` (or
    of the page) down to the bottom of ``until`` (or of ``element``, or of the page)."""
    with Chromium() as browser:
        tab = browser.new_page(offline=True)
        tab.load(page.resolve().as_uri())
        box = (
            "(s, edge) => { const r = document.querySelector(s).getBoundingClientRect();"
            " return (edge === 'top' ? r.top : r.bottom) + window.scrollY; }"
        )
        top = tab.evaluate(f"({box})({element!r}, 'top')") if element else 0
        last = until or element
        bottom = tab.evaluate(f"({box})({last!r}, 'bottom')") if last else None
        tab.screenshot(out, top=float(top), bottom=None if bottom is None else float(bottom) + 6)
    print(f"{out}: {out.stat().st_size / 1024:.0f} KiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--shot", nargs=2, type=Path, metavar=("PAGE", "PNG"))
    parser.add_argument("--element", help="with --shot: from this element (CSS selector)")
    parser.add_argument("--until", help="with --shot: down to the bottom of this element")
    args = parser.parse_args()
    if args.shot:
        shot(args.shot[0], args.shot[1], element=args.element, until=args.until)
        return
    with Chromium() as browser:
        for run in args.runs:
            measure(run, browser)


if __name__ == "__main__":
    main()

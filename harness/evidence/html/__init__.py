"""The auditor's pages of a run: ``index.html`` and one page per experiment run.

Entry point: :func:`write_run_pages` (then ``manifest.write_manifest`` to seal
the directory). Both read only the run directory, so ``fencecheck report``
can rebuild the pages from the evidence at any later time.
"""

from __future__ import annotations

from pathlib import Path

from harness.evidence import manifest
from harness.evidence.html.pages import experiment_page, index_page
from harness.evidence.run_dir import Entry, load_yaml, require_archives


def write_run_pages(
    report_dir: Path, out_dir: Path | None = None, *, title: str | None = None
) -> Path:
    """Write ``index.html`` and ``experiments/<label>.html`` for the run in
    ``report_dir`` (into ``out_dir``, default the run directory itself) from
    its archives; returns the index's path. NotARunDirectory if it has none."""
    out = out_dir or report_dir
    out.mkdir(parents=True, exist_ok=True)
    entries: list[Entry] = []
    for path in require_archives(report_dir):
        try:
            archive, problem = load_yaml(path), None
        except ValueError as exc:
            archive, problem = None, str(exc)
        entries.append(experiment_page(report_dir, path.stem, archive, problem, out))
    digest = manifest.run_digest(report_dir)
    return index_page(report_dir, entries, digest, out, title=title)

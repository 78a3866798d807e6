"""The auditor's pages of a run: ``index.html`` and one page per experiment run.

Entry point: :func:`write_run_pages` (then ``manifest.write_manifest`` to seal
the directory); :func:`build_run_pages` also returns every archive's index
line (``fencecheck report`` counts the unreadable ones). Both read only the
run directory, so ``fencecheck report`` can rebuild the pages from the
evidence at any later time.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

from harness.evidence import manifest, written
from harness.evidence.html.pages import experiment_page, index_page
from harness.evidence.run_dir import Entry, load_yaml, require_archives
from harness.parts.processes import die_with_parent

# Below this many archives a process pool costs more than it saves.
PARALLEL_FROM = 12
MAX_PROCESSES = 4


def _page(report_dir: Path, path: Path, out: Path, as_written: bytes | None = None) -> Entry:
    """Read one archive and write its page (in a pool process, or not);
    ``as_written``: the value this process wrote the file from, pickled
    (harness.evidence.written), instead of parsing the file."""
    if as_written is not None:
        archive: Any = pickle.loads(as_written)
        return experiment_page(report_dir, path.stem, archive, None, out)
    try:
        archive, problem = load_yaml(path), None
    except ValueError as exc:
        archive, problem = None, str(exc)
    return experiment_page(report_dir, path.stem, archive, problem, out)


def _pages_in_pool(report_dir: Path, paths: list[Path], out: Path, processes: int) -> list[Entry]:
    # spawn: no fork of a process that may still hold threads and locks.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        processes,
        mp_context=context,
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    ) as pool:
        jobs = [pool.submit(_page, report_dir, p, out, written.recall(p)) for p in paths]
        try:
            return [job.result() for job in jobs]
        except BaseException:
            # A stop, or a file refused: the pages still queued are not built.
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _stop_resource_tracker() -> None:
    """End the helper process a spawn pool leaves behind (multiprocessing's
    resource tracker): it would otherwise outlive the pool and end only after
    this process does, a moment later, or later still on a busy machine, so a
    finished run would leave a process running. Collected first, so no
    semaphore of the pool unregisters later and starts a tracker again."""
    gc.collect()
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    stop = getattr(tracker, "_stop", None)
    if stop is not None:
        stop()


class PagesCut(TimeoutError):
    """Not every page was written before the deadline (a stopping run's)."""


def write_run_pages(
    report_dir: Path,
    out_dir: Path | None = None,
    *,
    title: str | None = None,
    deadline: float | None = None,
    sealed: bool = False,
) -> Path:
    """:func:`build_run_pages`; returns the index's path."""
    index, _entries = build_run_pages(
        report_dir, out_dir, title=title, deadline=deadline, sealed=sealed
    )
    return index


def build_run_pages(
    report_dir: Path,
    out_dir: Path | None = None,
    *,
    title: str | None = None,
    deadline: float | None = None,
    sealed: bool = False,
) -> tuple[Path, list[Entry]]:
    """Write ``index.html`` and ``experiments/<label>.html`` for the run in
    ``report_dir`` (into ``out_dir``, default the run directory itself) from
    its archives; returns the index's path and the archives' index lines.
    NotARunDirectory if it has none.

    Large runs (``--repeat``) are parsed and drawn by a few processes at once;
    the pages do not depend on which process wrote them. With ``deadline``
    (a ``time.monotonic()`` value: a stopping run has seconds) the pages are
    written in this process, and PagesCut is raised, without an index, when
    the deadline passes first. ``sealed``: the caller seals the folder next
    (the index links MANIFEST.sha256 before it exists).
    """
    out = out_dir or report_dir
    out.mkdir(parents=True, exist_ok=True)
    paths = require_archives(report_dir)
    processes = min(MAX_PROCESSES, os.cpu_count() or 1)
    entries: list[Entry]
    if deadline is not None:
        entries = []
        for p in paths:
            if time.monotonic() > deadline:
                raise PagesCut(f"{len(entries)} of {len(paths)} experiment pages written in time")
            entries.append(_page(report_dir, p, out, written.recall(p)))
    elif len(paths) < PARALLEL_FROM or processes < 2:
        entries = [_page(report_dir, p, out, written.recall(p)) for p in paths]
    else:
        entries = _pages_in_pool(report_dir, paths, out, processes)
        _stop_resource_tracker()
    digest = manifest.run_digest(report_dir)
    index = index_page(report_dir, entries, digest, out, title=title, sealed=sealed)
    return index, entries

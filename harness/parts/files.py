"""Removing the harness's own temp directories, fast.

A temp root holds PostgreSQL data directories: about a thousand small files
each, and removing them is thousands of unlinks, each waiting on the
filesystem's journal. On a busy disk that is slow one after the other, so
they go out from many threads at once; a run that is stopping has seconds.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Measured on this 2-core VM under load (load average 15), seven data
# directories (280 MB): 2 threads 4.7 s, 8 threads 2.0 s, 32 threads 1.4 s.
REMOVE_THREADS = 32
_BATCH = 64


def _unlink_all(paths: list[str]) -> int:
    total = 0
    for file in paths:
        with contextlib.suppress(OSError):
            total += os.lstat(file).st_blocks * 512
            os.unlink(file)
    return total


def remove_tree(path: Path) -> int:
    """Remove ``path`` and everything under it; the bytes it held. Files are
    unlinked by several threads at once, then the directories bottom-up."""
    directories: list[str] = []
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(path):
        directories.append(dirpath)
        files.extend(os.path.join(dirpath, n) for n in filenames)
        # A symlink to a directory is removed as a link, never followed.
        files.extend(
            os.path.join(dirpath, n) for n in dirnames if os.path.islink(os.path.join(dirpath, n))
        )
    batches = [files[i : i + _BATCH] for i in range(0, len(files), _BATCH)]
    with ThreadPoolExecutor(max_workers=REMOVE_THREADS, thread_name_prefix="remove") as pool:
        total = sum(pool.map(_unlink_all, batches))
    for directory in reversed(directories):
        with contextlib.suppress(OSError):
            os.rmdir(directory)
    return total

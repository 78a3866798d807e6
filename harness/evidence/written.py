"""Archives as this process wrote them, so a run's pages need not parse them.

Parsing a run's archives back from YAML (PyYAML builds every value in
Python) cost more CPU than writing them, and came at the very end of a run,
after the last experiment. The value an archive was written from is kept
here (pickled, much faster to load) with the digest of the text written;
the pages take it only while the file on disk still holds exactly that text
(read and hashed again at that moment), else they parse the file as any
later ``fencecheck report`` does. Bounded: past :data:`LIMIT` bytes the
oldest go first, and a page parses its file.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

LIMIT = 128 * 1024 * 1024

_lock = threading.Lock()
_kept: OrderedDict[Path, tuple[bytes, bytes]] = OrderedDict()
_size = 0


def remember(path: Path, text: str, archive: Any) -> None:
    """``archive`` was written to ``path`` as ``text``."""
    global _size
    pickled = pickle.dumps(archive, protocol=pickle.HIGHEST_PROTOCOL)
    digest = hashlib.sha256(text.encode()).digest()
    key = path.resolve()
    with _lock:
        old = _kept.pop(key, None)
        if old is not None:
            _size -= len(old[1])
        if len(pickled) > LIMIT:
            return
        _kept[key] = (digest, pickled)
        _size += len(pickled)
        while _size > LIMIT:
            _, (_, dropped) = _kept.popitem(last=False)
            _size -= len(dropped)


def recall(path: Path) -> bytes | None:
    """The pickled value ``path`` was written from, when the file still holds
    exactly the text written; None otherwise (parse the file)."""
    key = path.resolve()
    with _lock:
        kept = _kept.get(key)
    if kept is None:
        return None
    try:
        on_disk = hashlib.sha256(key.read_bytes()).digest()
    except OSError:
        return None
    return kept[1] if on_disk == kept[0] else None

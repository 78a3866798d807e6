"""The workers' own logs, read for what must never be in them.

Contract section 9: a sensitive field is sent in clear only to the tool and
never logged. The harness plants values of a shape it can find (``ct_`` and
24 hex digits, :data:`PLANTED_SHAPE`); this reads every log file a worker
process left (its stdout, its stderr and its event history) and notes each
line that holds one. The global ``effect.sensitive_field_never_logged``
judges the result; the archive masks the values themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from harness.checking.invariants.effects import PLANTED_SHAPE
from harness.checking.invariants.model import WorkerLogs

#: Lines noted per run at most: one is a violation, the rest only say where.
MAX_NOTED = 20


def read_worker_logs(paths: Iterable[Path]) -> WorkerLogs:
    """Scan each existing file of ``paths`` for planted sensitive values."""
    found = WorkerLogs()
    for path in sorted(set(paths)):
        try:
            handle = path.open("r", encoding="utf-8", errors="replace")
        except OSError:
            continue  # never written: the process logged nothing there
        found.files += 1
        with handle:
            for number, line in enumerate(handle, start=1):
                if PLANTED_SHAPE.search(line) and len(found.planted_at) < MAX_NOTED:
                    found.planted_at.append({"file": path.name, "line": number})
    return found

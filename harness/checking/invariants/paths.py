"""Which write path each protected write took (issue: the production path under test).

A worker may have more than one way to commit a protected write (the
reference worker: one fast statement, or a stepped transaction that can host
injection points inside it). It declares each path by a text its top-level
statement contains (``<worker-cmd> write-paths``, worker contract §1); the
harness's audit trigger records the statement of every write, so which path a
write took is the harness's observation, not the worker's word.
"""

from __future__ import annotations

from typing import Any

from harness.checking.invariants.model import Change, Evidence, Finding
from harness.checking.invariants.registry import invariant
from harness.checking.invariants.writes import protected_writes


def path_of(ev: Evidence, write: Change) -> str | None:
    """The declared path whose marker the write's statement contains."""
    found = [name for name, marker in ev.write_paths.items() if marker in write.statement]
    return found[0] if len(found) == 1 else None


def path_per_write(ev: Evidence) -> list[dict[str, Any]]:
    """Each protected write with the path it took (``undeclared``: no marker matched)."""
    return [
        {
            "run_id": w.row.get("run_id"),
            "revision": w.row.get("revision"),
            "app": w.app,
            "path": path_of(ev, w) or "undeclared",
        }
        for w in protected_writes(ev)
    ]


def paths_taken(ev: Evidence) -> dict[str, int]:
    """Protected writes per path."""
    counts: dict[str, int] = {}
    for w in path_per_write(ev):
        counts[w["path"]] = counts.get(w["path"], 0) + 1
    return counts


@invariant(
    "harness.write_path_as_asked",
    "issue 12 item 6 (the production write path under test)",
    "every protected write took the write path the experiment asked the worker for "
    "(FENCECHECK_WRITE_PATH), and that path was taken at least once when there were writes",
)
def write_path_as_asked(ev: Evidence) -> Finding:
    asked = ev.asked_write_path
    if asked is None or asked not in ev.write_paths:
        declared = ", ".join(sorted(ev.write_paths)) or "none"
        return Finding(0, [], f"not judged: asked {asked!r}, the worker declares: {declared}")
    writes = protected_writes(ev)
    bad = []
    for w in writes:
        taken = path_of(ev, w)
        if taken != asked:
            row = w.brief("run_id", "revision")
            row["path"] = taken
            row["statement"] = w.statement[:160]
            bad.append(row)
    counts = paths_taken(ev)
    return Finding(len(writes), bad, f"asked {asked}; taken {counts or 'no protected write'}")

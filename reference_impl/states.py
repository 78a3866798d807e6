"""The run state table (Chinese seed §3.1, English seed §7), as Python reads it.

The one place that decides is the database: ``fencecheck._state_table()``
(migration 009), enforced on every status change by the guard trigger.
This module mirrors it for the model-based test, and
``tests/reference_impl/test_operations.py`` holds the two equal.

Each row: (action, from status, to status, actor). Worker actions need the
lease; operator actions are the control plane's decisions; ``resume`` is the
reconciler's, when the last operation in doubt of a paused run converged.
"""

from __future__ import annotations

LIVE = ("running", "waiting_tool")
PAUSED = ("paused_indoubt", "paused_human")
TERMINAL = ("succeeded", "failed", "cancelled")
STATUSES = ("queued", *LIVE, *PAUSED, *TERMINAL)

_WORKER = {
    "checkpoint": None,  # keeps the status
    "intent": "waiting_tool",
    "tool_result": "running",
    "succeed": "succeeded",
    "fail": "failed",
    "freeze": "paused_indoubt",
    "pause_human": "paused_human",
    "requeue": "queued",
    "release": "queued",
}

TABLE: tuple[tuple[str, str, str, str], ...] = (
    ("grant", "queued", "running", "worker"),
    ("start", "running", "running", "worker"),
    *((action, frm, to or frm, "worker") for action, to in _WORKER.items() for frm in LIVE),
    *(("cancel", frm, "cancelled", "operator") for frm in ("queued", *LIVE, *PAUSED)),
    ("resolve", "paused_indoubt", "queued", "operator"),
    ("approve", "paused_human", "queued", "operator"),
    ("supplement", "paused_human", "queued", "operator"),
    ("terminate", "paused_human", "failed", "operator"),
    ("terminate", "paused_indoubt", "failed", "operator"),
    ("resume", "paused_indoubt", "queued", "reconcile"),
    # the attempt budget's safety net of requeue
    ("requeue", "running", "failed", "worker"),
    ("requeue", "waiting_tool", "failed", "worker"),
)


def target(action: str, status: str) -> str | None:
    """Where ``action`` takes a run in ``status``; None when it is not allowed."""
    found = [to for a, frm, to, _ in TABLE if a == action and frm == status]
    return (
        sorted(found, key=lambda to: to == "failed" and action == "requeue")[0] if found else None
    )

"""Retention: archive and delete old finished tasks (``fencecheck.operator_purge``).

Invariant: nothing is deleted that is not first in the archive file, synced
to disk: the database deletes and returns the rows in one transaction, the
archive is written and fsynced, and only then is the transaction committed
(a failure before that rolls the deletion back). Runs in doubt, runs with
an operation prepared, dispatching or unknown, and runs with an outbox row
not yet published are never deleted (the database decides).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psycopg

from reference_impl.runs import translated


def purge(
    conn: psycopg.Connection[Any],
    older_than_s: float,
    reason: str,
    ticket: str | None,
    archive: Path | None,
    limit: int = 100,
) -> dict[str, Any]:
    """Purge up to ``limit`` tasks finished longer than ``older_than_s`` ago."""
    with conn.transaction():
        rows = translated(
            conn,
            "SELECT task_id, archived FROM fencecheck.operator_purge("
            "%(ms)s, %(limit)s, %(reason)s, %(ticket)s)",
            {"ms": round(older_than_s * 1000), "limit": limit, "reason": reason, "ticket": ticket},
        )
        if archive is not None and rows:
            created = not archive.exists()
            with archive.open("a", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row["archived"], default=str, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            if created:  # a new file's name is durable only once its directory is synced
                fd = os.open(archive.parent, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    return {
        "purged_tasks": [r["task_id"] for r in rows],
        "archive": str(archive) if archive else None,
    }

"""Durability contract (rule 11): what an acknowledged commit means here.

Ownership is judged on the primary only. The worker reads the settings
that decide what a COMMIT acknowledgement is worth and says which guarantee
holds; it never claims the synchronous guarantee under async replication.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from reference_impl.db import Conn
from reference_impl.queries import Queries

_SYNC_LEVELS = ("on", "remote_write", "remote_apply")

GUARANTEES = {
    "sync": (
        "synchronous replication: a COMMIT is acknowledged only after a synchronous standby"
        " confirmed it (synchronous_commit={level}); promoting that standby keeps every"
        " acknowledged epoch, checkpoint and ledger row. A COMMIT answered with the warning"
        " 'canceling wait for synchronous replication' is treated as outcome unknown, never"
        " as durable."
    ),
    "async": (
        "asynchronous replication: acknowledged commits (epochs, checkpoints, ledger rows)"
        " may be LOST if a lagging standby is promoted; after such a failover an old epoch"
        " may be granted again and stale workers must be fenced by other means. The"
        " synchronous guarantee is NOT claimed."
    ),
    "none": (
        "no standby visible: commits are durable on this primary only (fsync); there is no"
        " failover target, and a restore from backup can lose acknowledged epochs."
    ),
}


@dataclass(frozen=True)
class Contract:
    mode: str  # sync | async | none
    guarantee: str
    settings: dict[str, Any] = field(default_factory=dict)
    standbys: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "guarantee": self.guarantee,
            "settings": self.settings,
            "standbys": self.standbys,
        }


def read_contract(conn: Conn, queries: Queries) -> Contract:
    """Read the settings (and pg_stat_replication where visible) and judge."""
    row = conn.execute(queries.sql("durability_settings")).fetchone()
    assert row is not None
    settings = dict(row)
    try:
        standbys = [dict(r) for r in conn.execute(queries.sql("replication_view")).fetchall()]
    except psycopg.errors.InsufficientPrivilege:
        standbys = []
    level = str(settings["synchronous_commit"])
    names = str(settings["synchronous_standby_names"]).strip()
    if names and level in _SYNC_LEVELS:
        mode = "sync"
    elif names or standbys:
        mode = "async"
    else:
        mode = "none"
    guarantee = GUARANTEES[mode].format(level=level)
    if level == "off":
        guarantee += " synchronous_commit=off: even a local COMMIT may be lost in a crash."
    if settings.get("in_recovery"):
        guarantee = "this server is a standby: ownership cannot be judged here. " + guarantee
    return Contract(mode, guarantee, settings, standbys)

"""Checkpoint schema versions (rule 13).

Current version: 2. Version 1 has an explicit, documented migration; any
other version (0, 99, missing) is refused with SchemaVersionUnknown, never
parsed into zero values. A state whose stored hash does not match is refused
with CheckpointCorrupt.

Version 2 state (what the built-in workflow writes)::

    {"workflow": "refund", "plan": ["plan", "lookup", ...], "cursor": 2,
     "data": {...}, "results": {"<step>": ...}, "pending": {...} | null}

Version 1 state (older workers)::

    {"step": "<name of the next step>", "done": ["plan", ...], "vars": {...}}

Migration 1 -> 2: ``plan`` = ``done`` + the default plan's steps from
``step`` on; ``cursor`` = ``len(done)``; ``data`` = ``vars``; ``results`` =
{} and ``pending`` = null (version 1 never recorded tool results, and never
persisted a pending tool call: a v1 run waiting on a tool cannot exist).
A v1 state missing any of its three fields is refused, not defaulted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reference_impl.errors import CheckpointCorrupt, SchemaVersionUnknown
from reference_impl.ids import state_hash

CURRENT_VERSION = 2
DEFAULT_PLAN: tuple[str, ...] = ("plan", "lookup", "create_label", "notify", "finish")


@dataclass(frozen=True)
class Checkpoint:
    """A decoded checkpoint, always in the current schema version."""

    revision: int
    schema_version: int  # as stored (before migration)
    state: dict[str, Any]
    migrated_from: int | None = None


def _require(state: dict[str, Any], key: str, kind: type, version: int) -> Any:
    value = state.get(key)
    # JSON true is no integer, though Python's bool is one: a cursor of true
    # would resume at step 1 (blind hunt 64's reader; the Go worker refuses it).
    if key not in state or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SchemaVersionUnknown(
            f"checkpoint v{version} lacks a valid {key!r} ({kind.__name__}): refused, not defaulted",
            reason="malformed",
        )
    return state[key]


def migrate_v1(state: dict[str, Any]) -> dict[str, Any]:
    """The explicit 1 -> 2 migration (see the module docstring)."""
    step = _require(state, "step", str, 1)
    done = list(_require(state, "done", list, 1))
    data = dict(_require(state, "vars", dict, 1))
    rest = list(DEFAULT_PLAN[DEFAULT_PLAN.index(step) :]) if step in DEFAULT_PLAN else [step]
    return {
        "workflow": "refund",
        "plan": done + [s for s in rest if s not in done],
        "cursor": len(done),
        "data": data,
        "results": {},
        "pending": None,
    }


def validate_v2(state: dict[str, Any]) -> dict[str, Any]:
    """Check the fields the built-in workflow relies on; refuse rather than default.

    ``decode`` does not call it: a v2 checkpoint written through the ops
    interface may hold any object; the workflow validates what it resumes.
    """
    _require(state, "plan", list, 2)
    cursor = _require(state, "cursor", int, 2)
    _require(state, "data", dict, 2)
    _require(state, "results", dict, 2)
    if not 0 <= cursor <= len(state["plan"]):
        raise SchemaVersionUnknown("checkpoint v2 cursor out of range", reason="malformed")
    return state


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: migrate_v1}


def decode(
    revision: int,
    schema_version: int | None,
    state: Any,
    stored_hash: bytes | None = None,
    known: Sequence[int] = (1, CURRENT_VERSION),
) -> Checkpoint:
    """Turn a stored checkpoint into a current-version one, or refuse it."""
    if schema_version is None or schema_version not in known:
        raise SchemaVersionUnknown(
            f"checkpoint schema_version {schema_version!r} is unknown to this worker"
            f" (knows {list(known)}): refused",
            reason=str(schema_version),
        )
    if not isinstance(state, dict):
        raise SchemaVersionUnknown("checkpoint state is not an object", reason="malformed")
    if stored_hash is not None and bytes(stored_hash) != state_hash(state):
        raise CheckpointCorrupt(f"checkpoint revision {revision}: state does not match its hash")
    if schema_version == CURRENT_VERSION:
        return Checkpoint(revision, schema_version, dict(state))
    migrated = MIGRATIONS[schema_version](dict(state))
    return Checkpoint(revision, schema_version, migrated, migrated_from=schema_version)

"""Identities: operation_id from business intent, canonical JSON, digests.

Invariants:
- ``operation_id`` is a pure function of (tenant, run, step, effect_version):
  it never contains a worker, epoch, attempt or time, so a takeover or a
  restart derives the same id for the same intent (rule 5).
- The canonical JSON form is fixed (sorted keys, no whitespace, UTF-8, no
  NaN), so a digest is comparable across processes and languages.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value``."""
    return _CANONICAL.encode(value)


def request_digest(value: Any) -> str:
    """SHA-256 hex of the canonical JSON of a tool request."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def state_hash(state: Any) -> bytes:
    """SHA-256 of the canonical JSON of a checkpoint state (stored as bytea)."""
    return canonical_hash(canonical_json(state))


def canonical_hash(canonical: str) -> bytes:
    """SHA-256 of a canonical JSON text (``state_hash`` of the value it encodes)."""
    return hashlib.sha256(canonical.encode("utf-8")).digest()


def operation_id(tenant_id: str, run_id: str, step_id: str, effect_version: int) -> str:
    """The stable identity of one business side-effect intent."""
    if effect_version <= 0:
        raise ValueError("effect_version starts at 1")
    return f"{tenant_id}/{run_id}/{step_id}/v{effect_version}"


def new_event_id() -> uuid.UUID:
    """A fresh outbox event id; callers reuse it when a commit's outcome is unknown."""
    return uuid.uuid4()

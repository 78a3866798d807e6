"""Canonical JSON and request digests.

Invariant: two requests get the same digest exactly when they are equal as
JSON values (object key order and whitespace do not matter), so the digest can
be compared across processes and languages. The form is fixed:
``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
encoded as UTF-8, hashed with SHA-256, written as lowercase hex.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value`` (NaN and infinities refused)."""
    # allow_nan=False: NaN is not JSON, and other languages would not round-trip it.
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def request_digest(value: Any) -> str:
    """SHA-256 hex of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()

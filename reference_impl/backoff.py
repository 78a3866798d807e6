"""Retry backoff (Chinese seed §10): exponential, capped, with bounded jitter.

Invariant: the delay is a pure function of (run_id, attempt): computed the
same way by any worker, any time, so the ``next_attempt_at`` a requeue
stores can be checked from the database alone (experiment U does). The
jitter spreads runs that failed together; it never exceeds half the delay.

    delay(run, attempt) = d / 2 + jitter,   d = min(BASE_MS * 2^(attempt-1), CAP_MS),
    jitter = floor(d / 2 * u),              u = first 8 bytes of
                                            sha256("<run_id>:<attempt>") / 2^64
"""

from __future__ import annotations

import hashlib

BASE_MS = 200
CAP_MS = 60_000


def delay_ms(run_id: str, attempt: int, base_ms: int = BASE_MS, cap_ms: int = CAP_MS) -> int:
    """Milliseconds to wait before attempt ``attempt + 1`` of run ``run_id`` (attempt >= 1)."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    full: int = min(base_ms * (1 << min(attempt - 1, 32)), cap_ms)
    digest = hashlib.sha256(f"{run_id}:{attempt}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return full // 2 + int(full / 2 * u)

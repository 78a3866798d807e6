"""The worker's event history (worker contract, section 4), Jepsen-style.

``invoke`` before trying, then ``ok`` (definitely happened), ``fail``
(definitely did not) or ``info`` (unknown: a timeout, a lost connection, a
commit whose outcome is unknown). A no-op outside the harness.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from harness import injection
from reference_impl import errors as e
from reference_impl.sqlstate import outcome_unknown

# Errors after which it is unknown whether the operation took effect.
_UNKNOWN = (e.CommitOutcomeUnknown, e.CommitInconsistent, TimeoutError)


class Op:
    """Ids of one history operation; fill in what becomes known on the way."""

    def __init__(self, name: str, **ids: Any) -> None:
        self.name = name
        self.ids: dict[str, Any] = {
            k: ids.pop(k, None) for k in ("run_id", "epoch", "revision", "operation_id", "event_id")
        }
        self.detail: dict[str, Any] = ids

    def record(self, type_: str, error: BaseException | str | None = None) -> None:
        injection.record(type_, self.name, error=error, detail=self.detail, **self.ids)


def is_unknown(exc: BaseException) -> bool:
    if isinstance(exc, _UNKNOWN):
        return True
    return isinstance(exc, psycopg.Error) and outcome_unknown(exc)


@contextmanager
def operation(name: str, **ids: Any) -> Iterator[Op]:
    """Record invoke, then ok / fail / info according to how the block ended."""
    op = Op(name, **ids)
    op.record("invoke")
    try:
        yield op
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
            op.record("info", exc)
        else:
            op.record("info" if is_unknown(exc) else "fail", exc)
        raise
    op.record("ok")

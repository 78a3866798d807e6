"""JSON logs on stderr carrying run_id, owner, epoch, revision, operation_id, trace_id.

Ids go to logs only, never to metric labels (high cardinality). The
trace_id of a line that names a run and an epoch is the same for every
line of that execution, in every thread and every process that logs it
(worker, heartbeat, a successor reading the run's history):
:func:`trace_id` derives it from (run_id, epoch), in the W3C trace-context
size (32 hex digits), so logs correlate without passing a context around.
Sensitive values never reach a log: no request body, checkpoint state or
tool payload is ever a field.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from typing import Any

_IDS = (
    "trace_id",
    "run_id",
    "owner",
    "epoch",
    "revision",
    "operation_id",
    "event_id",
    "task_id",
)


def trace_id(run_id: object, epoch: object) -> str:
    """The trace of one execution: 32 hex digits derived from (run_id, epoch)."""
    return hashlib.sha256(f"{run_id}:{epoch}".encode()).hexdigest()[:32]


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, message, the ids, extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            if (
                "trace_id" not in fields
                and fields.get("run_id")
                and fields.get("epoch") is not None
            ):
                fields = {"trace_id": trace_id(fields["run_id"], fields["epoch"]), **fields}
            for key in _IDS:
                if key in fields:
                    entry[key] = fields[key]
            for key, value in fields.items():
                if key not in entry:
                    entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


def setup(worker_id: str, level: int = logging.INFO) -> None:
    """Send the reference_impl loggers to stderr as JSON (idempotent)."""
    root = logging.getLogger("reference_impl")
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    logging.Formatter.converter = time.gmtime
    _worker[0] = worker_id


_worker = [""]


def log(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    """Log ``msg`` with structured fields (ids first)."""
    if _worker[0]:
        fields.setdefault("worker", _worker[0])
    logger.log(level, msg, extra={"fields": fields})

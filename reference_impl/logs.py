"""JSON logs on stderr carrying run_id, owner, epoch, revision, operation_id.

Ids go to logs only, never to metric labels (high cardinality).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_IDS = ("run_id", "owner", "epoch", "revision", "operation_id", "event_id", "task_id")


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

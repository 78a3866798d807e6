"""Worker metrics as evidence: scraped before a worker stops, or read from the
snapshot a worker writes when it exits on its own (worker contract,
``FENCECHECK_METRICS_PORT`` / ``FENCECHECK_METRICS_FILE``).

Metrics are a worker's own account, like its history: they explain and are
checked to move (tests/harness/test_metrics.py), no verdict rests on them.
Kept compactly: every sample that is not zero, histograms as their count
and sum.
"""

from __future__ import annotations

import contextlib
import http.client
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 1.0


def scrape(port: int, timeout_s: float = SCRAPE_TIMEOUT_S) -> str | None:
    """The text exposition served on 127.0.0.1:port, or None (nothing answered)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read().decode()
        return body if resp.status == 200 else None
    except OSError:
        return None
    finally:
        conn.close()


def read_snapshot(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text()
    return None


def samples(text: str) -> list[dict[str, Any]]:
    """Non-zero samples: ``{"name", "labels", "value"}``; histogram buckets left out."""
    out: list[dict[str, Any]] = []
    for family in text_string_to_metric_families(_without_buckets(text)):
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created") or not s.value:
                continue
            out.append({"name": s.name, "labels": dict(s.labels), "value": s.value})
    return out


def _without_buckets(text: str) -> str:
    """``text`` without the sample lines :func:`samples` leaves out anyway
    (a histogram's buckets, ``_created`` stamps): most of an exposition, and
    the parser is pure Python."""
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not _name(line).endswith(("_bucket", "_created"))
    )


def _name(line: str) -> str:
    """A sample line's metric name ('' for a comment or an empty line)."""
    if line.startswith("#"):
        return ""
    return line.split("{", 1)[0].split(" ", 1)[0].strip()


def total(found: list[dict[str, Any]], name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    return sum(
        float(s["value"])
        for s in found
        if s["name"] == name and all(s["labels"].get(k) == v for k, v in labels.items())
    )

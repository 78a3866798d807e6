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
import re
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
    """Non-zero samples: ``{"name", "labels", "value"}``; histogram buckets left out.

    Read line by line for the exposition's common shape (what the reference
    workers' client libraries write); an exposition with anything else (an
    escape other than ``\\\\``, ``\\"``, ``\\n``, a value that is not a
    number, a line it cannot split) goes to prometheus_client's parser,
    which is pure Python and was a tenth of the harness's CPU."""
    try:
        return _common_samples(text)
    except _Unusual:
        return _parsed_samples(text)


class _Unusual(ValueError):
    """A line :func:`_common_samples` does not read."""


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?[0-9]+)?[ \t]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r"\\.")


def _common_samples(text: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line)
        if match is None:
            raise _Unusual(line)
        name, labels_text, value_text = match.groups()
        if name.endswith(("_bucket", "_created")):
            continue
        try:
            value = float(value_text)
        except ValueError:
            raise _Unusual(line) from None
        if not value:
            continue
        out.append({"name": name, "labels": _labels(labels_text or ""), "value": value})
    return out


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    at = 0
    while at < len(text):
        match = _LABEL.match(text, at)
        if match is None or match.end() == at:
            raise _Unusual(text)
        labels[match.group(1)] = _ESCAPE.sub(_unescape, match.group(2))
        at = match.end()
    return labels


def _unescape(match: re.Match[str]) -> str:
    found = _ESCAPES.get(match.group())
    if found is None:
        raise _Unusual(match.group())
    return found


def _parsed_samples(text: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith(("_bucket", "_created")) or not s.value:
                continue
            out.append({"name": s.name, "labels": dict(s.labels), "value": s.value})
    return out


def total(found: list[dict[str, Any]], name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    return sum(
        float(s["value"])
        for s in found
        if s["name"] == name and all(s["labels"].get(k) == v for k, v in labels.items())
    )

"""Worker metrics kept as evidence: the buckets dropped before parsing change
nothing the parser would have kept."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from harness.evidence.metrics import samples


def _everything(text: str) -> list[dict[str, object]]:
    return [
        {"name": s.name, "labels": dict(s.labels), "value": s.value}
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith(("_bucket", "_created")) and s.value
    ]


def test_samples_are_what_a_full_parse_keeps() -> None:
    registry = CollectorRegistry()
    renew = Histogram("renew_seconds", "renewal time", ["outcome"], registry=registry)
    renew.labels("ok").observe(0.02)
    renew.labels("timeout").observe(1.5)
    calls = Counter("tool_calls", "tool calls", ["tool", "note"], registry=registry)
    calls.labels("plain", 'a "quoted" {brace} value_bucket').inc(3)
    Gauge("epoch", "epoch", registry=registry).set(2)
    Gauge("idle", "zero", registry=registry).set(0)
    text = generate_latest(registry).decode()
    assert "_bucket" in text and "_created" in text
    kept = samples(text)
    assert kept == _everything(text)
    assert {s["name"] for s in kept} >= {"renew_seconds_count", "tool_calls_total", "epoch"}

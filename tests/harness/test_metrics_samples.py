"""Worker metrics kept as evidence: the buckets dropped before parsing change
nothing the parser would have kept."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from harness.evidence import metrics
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


def _same(a: list[dict[str, object]], b: list[dict[str, object]]) -> bool:
    def key(x: dict[str, object]) -> object:
        v = x["value"]
        return (x["name"], x["labels"], "nan" if isinstance(v, float) and math.isnan(v) else v)

    return [key(x) for x in a] == [key(x) for x in b]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.text(max_size=12), min_size=1, max_size=4),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=4),
)
def test_the_line_reader_agrees_with_the_full_parser(notes: list[str], values: list[float]) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("g", "a gauge", ["note"], registry=registry)
    for note, value in zip(notes, values, strict=False):
        gauge.labels(note).set(value)
    Histogram("h_seconds", "h", registry=registry).observe(
        values[0] if math.isfinite(values[0]) else 1
    )
    text = generate_latest(registry).decode()
    assert _same(samples(text), _everything(text))


def test_an_unusual_exposition_goes_to_the_full_parser() -> None:
    text = 'm{a="tab\\there \\q"} 2\nn 3 1700000000000\n'
    assert _same(samples(text), _everything(text))
    odd = "x 3 4 5\n"  # not a sample line the reader knows: the parser decides
    try:
        expected = _everything(odd)
    except ValueError:
        expected = None
    try:
        got = samples(odd)
    except ValueError:
        got = None
    assert got == expected
    assert metrics._common_samples('k{a="1",b="x\\"y"} 4\n') == [
        {"name": "k", "labels": {"a": "1", "b": 'x"y'}, "value": 4.0}
    ]

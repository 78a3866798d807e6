"""The archives' own YAML emitter: whatever it writes, PyYAML's safe loader
reads back as the value written (generated data with every awkward string,
and a real archive); what it cannot write goes to PyYAML whole."""

from __future__ import annotations

import datetime
import enum
import math
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.evidence.yaml_emit import emit_yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Strings that mean something else to YAML, or sit on its edges.
AWKWARD = st.sampled_from(
    [
        "",
        " ",
        "yes",
        "No",
        "on",
        "~",
        "null",
        "1:20",
        "0x1F",
        "1_000",
        "2026-12-06",
        "2026-12-06 06:13:55",
        ".inf",
        "-.5",
        "1e3",
        "<<",
        "=",
        "- x",
        "? x",
        "a: b",
        "a #b",
        "a:",
        "#x",
        "---",
        "...",
        "--- x",
        "'q'",
        '"q"',
        "!tag",
        "&a",
        "*a",
        "|",
        ">",
        "%x",
        "@x",
        "`x",
        "a\nb",
        "a\n",
        "a\n\n",
        "\na",
        " a\nb",
        "a\n b",
        "a\n \nb",
        "a\tb\nc",
        "a\r\nb",
        "tab\there",
        "\x85\u2028\u2029\ufeff\x7f\x9f",
        "emoji 🙂 zoë 中文",
        "x" * 1100,
    ]
)
TEXT = st.one_of(AWKWARD, st.text(), st.text(alphabet=" \n\t:#-'\"ab"))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    TEXT,
)
PLAIN = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(TEXT, inner, max_size=4),
    ),
    max_leaves=30,
)


def back(value: Any) -> Any:
    return yaml.load(emit_yaml(value), Loader=LOADER)


@settings(max_examples=400, deadline=None)
@given(PLAIN)
def test_every_plain_value_reads_back_equal(value: Any) -> None:
    assert back(value) == value


@given(st.dictionaries(AWKWARD, AWKWARD, min_size=1))
def test_awkward_keys_and_values_read_back(value: dict[str, str]) -> None:
    assert back(value) == value


def test_special_floats_read_back() -> None:
    value = {"a": math.inf, "b": -math.inf, "c": 1e-05, "d": 1e16, "e": -0.0}
    assert back(value) == value
    assert math.isnan(back({"n": math.nan})["n"])


def test_the_block_style_of_an_archive() -> None:
    value = {
        "experiment_id": "F",
        "postgres_settings": {"fsync": "on", "version": "18.6"},
        "run_id": ["a", "b"],
        "history": [{"op": "claim", "ok": True}, {"op": "renew", "epoch": 2}],
        "empty": {},
        "none": [],
        "log": "line one\nline two\n",
    }
    assert emit_yaml(value) == (
        "experiment_id: F\n"
        "postgres_settings:\n"
        "  fsync: 'on'\n"
        "  version: '18.6'\n"
        "run_id:\n"
        "- a\n"
        "- b\n"
        "history:\n"
        "- op: claim\n"
        "  ok: true\n"
        "- op: renew\n"
        "  epoch: 2\n"
        "empty: {}\n"
        "none: []\n"
        "log: |\n"
        "  line one\n"
        "  line two\n"
    )


class Colour(enum.IntEnum):
    RED = 1


def test_what_it_does_not_write_goes_to_pyyaml_whole() -> None:
    # Not plain data: PyYAML's own representer decides (and refuses what it
    # cannot write, as before).
    when = datetime.date(2026, 12, 6)
    assert back({"day": when}) == {"day": when}
    assert back({1: "int key"}) == {1: "int key"}
    with pytest.raises(UnicodeEncodeError):  # as libyaml's emitter does
        emit_yaml({"s": "\ud800"})
    long_key = "k" * 1500
    assert back({long_key: 1}) == {long_key: 1}
    with pytest.raises(yaml.representer.RepresenterError):  # not plain data
        emit_yaml({"c": Colour.RED})

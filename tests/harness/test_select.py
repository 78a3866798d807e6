"""Selecting experiments and variants by name (`fencecheck run V[purge]`)."""

from __future__ import annotations

import pytest

import scenarios


def test_whole_experiments_and_variants() -> None:
    ids = ["v[purge]", "D-expired_first", "B"]
    assert [m.SPEC.id for m in scenarios.select(ids)] == ["V", "D", "B"]
    assert scenarios.variants(ids) == {"V": {"purge"}, "D": {"expired_first"}}
    # Naming the experiment whole runs every variant, whatever else is named.
    assert scenarios.variants(["V[purge]", "V"]) == {}
    assert scenarios.variants(["V[purge]", "V[terminate]"]) == {"V": {"purge", "terminate"}}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("V[nope]", "experiment V has no variant 'nope'; its variants: supplement"),
        ("A[x]", "experiment A has no variant 'x'; its variants: none"),
        ("V[", "unknown experiment 'V['"),
        ("ZZ", "unknown experiment 'ZZ'"),
    ],
)
def test_unknown_names_are_refused_with_what_exists(raw: str, message: str) -> None:
    with pytest.raises(scenarios.UnknownExperiment, match=message.replace("[", r"\[")):
        scenarios.select([raw])

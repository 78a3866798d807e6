"""The named-statement loader."""

from __future__ import annotations

import pytest

from reference_impl.queries import Queries, QueryFileError, parse


def test_parse_names_descriptions_and_bodies() -> None:
    text = "-- name: a\n-- first one\nSELECT 1;\n\n-- name: b\n-- second\nSELECT 2\n  FROM x;\n"
    a, b = parse(text, "t.sql")
    assert (a.name, a.description, a.sql) == ("a", "first one", "SELECT 1;")
    assert (b.name, b.sql) == ("b", "SELECT 2\n  FROM x;")


@pytest.mark.parametrize(
    "text",
    ["-- name: a\nSELECT 1;", "-- name: a\n-- d\n", "SELECT 1;\n-- name: a\n-- d\nSELECT 1;"],
)
def test_malformed_files_are_refused(text: str) -> None:
    with pytest.raises(QueryFileError):
        parse(text)


def test_duplicates_refused_and_lookup_names_known() -> None:
    st = parse("-- name: a\n-- d\nSELECT 1;")
    with pytest.raises(QueryFileError):
        Queries(st + st)
    with pytest.raises(KeyError, match="known: a"):
        Queries(st)["b"]


def test_package_queries_load_and_replace() -> None:
    q = Queries.load()
    for name in (
        "claim",
        "takeover",
        "renew",
        "release",
        "protected_write",
        "protected_write_fast",
        "lock_lease",
        "readback_by_event",
        "dispatch_claim",
        "record_tool_result",
        "expire_claims",
        "consume_dedup",
    ):
        assert q[name].description
    swapped = q.replace("renew", "SELECT 'renewed' AS outcome, now() AS lease_expires_at")
    assert "renewed" in swapped.sql("renew") and q.sql("renew") != swapped.sql("renew")
    assert len(swapped) == len(q)

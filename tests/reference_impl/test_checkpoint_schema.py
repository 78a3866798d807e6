"""Rule 13: checkpoint schema versions are migrated explicitly or refused."""

from __future__ import annotations

import pytest

from reference_impl.checkpoint_schema import CURRENT_VERSION, decode, validate_v2
from reference_impl.errors import CheckpointCorrupt, SchemaVersionUnknown
from reference_impl.ids import state_hash


def test_current_version_reads_as_is() -> None:
    state = {"plan": ["plan", "finish"], "cursor": 1, "data": {}, "results": {}}
    ck = decode(3, CURRENT_VERSION, state, state_hash(state))
    assert ck.state == state and ck.migrated_from is None


def test_v1_is_migrated_explicitly() -> None:
    v1 = {"step": "create_label", "done": ["plan", "lookup"], "vars": {"order_id": "o9"}}
    ck = decode(2, 1, v1, state_hash(v1))
    assert ck.migrated_from == 1
    assert ck.state["plan"] == ["plan", "lookup", "create_label", "notify", "finish"]
    assert ck.state["cursor"] == 2 and ck.state["data"] == {"order_id": "o9"}
    validate_v2(ck.state)


@pytest.mark.parametrize("version", [0, 99, None, 3])
def test_unknown_versions_are_refused(version: int | None) -> None:
    with pytest.raises(SchemaVersionUnknown):
        decode(1, version, {"anything": 1})


def test_v1_missing_fields_refused_not_defaulted() -> None:
    with pytest.raises(SchemaVersionUnknown):
        decode(1, 1, {"step": "lookup"})


def test_hash_mismatch_refused() -> None:
    with pytest.raises(CheckpointCorrupt):
        decode(1, 2, {"a": 1}, state_hash({"a": 2}))


@pytest.mark.parametrize("cursor", [True, False, 1.0, "1", None])
def test_a_cursor_that_is_no_json_integer_is_refused(cursor: object) -> None:
    state = {"plan": ["plan", "lookup", "finish"], "cursor": cursor, "data": {}, "results": {}}
    with pytest.raises(SchemaVersionUnknown):
        validate_v2(state)

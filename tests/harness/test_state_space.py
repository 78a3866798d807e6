"""The contract's state space is derived from operations.json: adding an
operation, a value or a group adds cells; a bad name is refused."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from harness.contract.spec import OPERATIONS_FILE, ContractFileError
from harness.contract.state_space import contract_space, derive


def _contract() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(OPERATIONS_FILE.read_text(encoding="utf-8"))
    return data


def test_every_operation_of_the_contract_has_cells() -> None:
    space = contract_space()
    ops = {o["op"] for o in _contract()["operations"]}
    assert {c.op for c in space.cells} == ops
    assert len({c.id for c in space.cells}) == len(space.cells)
    # Every declared reason names a cell of the space, never a stray id.
    assert set(space.unreachable) <= {c.id for c in space.cells}


def test_adding_an_operation_adds_its_cells() -> None:
    data = _contract()
    before = derive(data)
    bigger = copy.deepcopy(data)
    bigger["operations"].append(
        {
            "op": "pause_run",
            "cells": {
                "base": {"run_status": "running", "identity": "current"},
                "groups": [{"vary": ["run_status"]}, {"vary": ["identity"]}],
            },
        }
    )
    after = derive(bigger)
    added = {c.id for c in after.cells} - {c.id for c in before.cells}
    statuses = len(after.dimensions["run_status"].values)
    identities = len(after.dimensions["identity"].values)
    assert len(added) == statuses + identities - 1  # the base combination once
    assert "pause_run[run_status=running,identity=stale_epoch]" in added
    # One without cells is one cell.
    bigger["operations"].append({"op": "ping"})
    assert "ping" in {c.id for c in derive(bigger).cells}


def test_adding_a_state_adds_a_cell_to_every_op_that_varies_it() -> None:
    data = _contract()
    before = derive(data)
    bigger = copy.deepcopy(data)
    bigger["state_space"]["dimensions"]["ledger"]["values"].append("compensating")
    after = derive(bigger)
    added = {c.id for c in after.cells} - {c.id for c in before.cells}
    varying = {
        o["op"]
        for o in data["operations"]
        if any("ledger" in g.get("vary", []) for g in (o.get("cells") or {}).get("groups", []))
    }
    assert varying and {c.split("[")[0] for c in added} == varying
    assert all("ledger=compensating" in c for c in added)


def test_an_unreachable_rule_lists_its_cells_with_the_reason() -> None:
    space = contract_space()
    why = space.unreachable["claim[run=paused_human,target=any]"]
    assert "only a due queued run or an expired lease" in why
    assert "claim[run=paused_human,target=named]" not in space.unreachable


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("base", {"lease": "alive"}, "'alive' is not a value of dimension lease"),
        ("base", {"mood": "good"}, "undeclared dimension 'mood'"),
        ("groups", [{"vary": ["ledger"]}], "group names 'ledger', which has no base value"),
    ],
)
def test_a_bad_name_is_refused_with_the_operation(where: str, value: Any, message: str) -> None:
    data = _contract()
    op = next(o for o in data["operations"] if o["op"] == "renew")
    op["cells"][where] = value
    with pytest.raises(ContractFileError, match=message):
        derive(data)

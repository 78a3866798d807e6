"""The machine-readable contract (harness/contract): its files agree with each
other, experiment R's table follows the operation list, replies and history
lines are judged by the published schemas, and the catalog comparison
allows what the contract allows (extra columns, a surrogate key) and
nothing else."""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.contract import catalog, spec
from harness.contract.catalog import Catalog, Column, Table
from scenarios import r_stale_holder


def test_every_operation_has_a_schema_and_the_files_agree() -> None:
    ops = spec.operations()
    defs = spec.ops_schema()["$defs"]
    assert {o.op for o in ops} == {k.split(".")[0] for k in defs if k.endswith(".result")}
    assert all(o.checked_by or not o.required for o in ops)


def test_revision_advancing_ops_take_the_whole_lease_identity() -> None:
    for o in spec.operations():
        if o.advances_revision:
            assert set(o.identity) == {"owner", "epoch", "expected_revision"}, o.op


def test_stale_holder_table_comes_from_the_operation_list() -> None:
    names = [o.op for o in spec.stale_holder_operations(spec.operations())]
    assert names == [
        "renew",
        "heartbeat",
        "release",
        "save_checkpoint",
        "register_intent",
        "complete",
    ]


def test_invalid_choices_cover_every_enumerated_decision_and_only_wrong_values() -> None:
    cases = spec.invalid_choices(spec.operations())
    probed = {(op, arg) for op, arg, _ in cases}
    assert probed == {
        ("resolve_indoubt", "decision"),
        ("decide", "decision"),
        ("converge_operation", "outcome"),
    }
    for op, arg, value in cases:
        assert value not in spec.enumerated_args(op)[arg], (op, arg, value)
    # the outcome a person may never set: back into a state that dispatches again
    assert {"prepared", "dispatching", "unknown"} <= {
        v for op, _, v in cases if op == "converge_operation"
    }


def test_an_operation_added_to_the_contract_adds_stale_holder_cases() -> None:
    data = json.loads(spec.OPERATIONS_FILE.read_text())
    before = r_stale_holder.cases(spec.parse_operations(data))
    data["operations"].append(
        {
            "op": "fail_run",
            "plane": "worker",
            "required": False,
            "changes": ["run", "checkpoints", "outbox"],
            "identity": ["owner", "epoch", "expected_revision"],
            "advances_revision": True,
            "points": [],
            "checked_by": ["R"],
            "summary": "a failure write",
            "example": {
                "run_id": "{run_id}",
                "epoch": "{epoch}",
                "owner": "{owner}",
                "expected_revision": "{expected_revision}",
                "reason": "x",
            },
        }
    )
    after = r_stale_holder.cases(spec.parse_operations(data))
    added = [c for c in after if c not in before]
    assert {c.op for c in added} == {"fail_run"}
    # three identity combinations, each at the stale and at the current revision,
    # and the current holder's own identity at a revision left behind
    assert len(added) == 7
    assert {(c.identity, c.revision) for c in added} == {
        (i, r) for i in r_stale_holder.IDENTITIES for r in ("stale", "current")
    } | {(r_stale_holder.HOLDER, "stale")}


def test_fill_keeps_json_types() -> None:
    filled = spec.fill(
        {"epoch": "{epoch}", "nested": ["{owner}", "text {owner}"], "n": 1},
        {"epoch": 3, "owner": "A"},
    )
    assert filled == {"epoch": 3, "nested": ["A", "text {owner}"], "n": 1}
    with pytest.raises(KeyError):
        spec.fill({"x": "{missing}"}, {})


def test_reply_problems_judge_the_envelope_and_the_result() -> None:
    good = {
        "id": 1,
        "ok": True,
        "result": {
            "run_id": "0b6c2f1e-0000-4000-8000-000000000001",
            "epoch": 2,
            "revision": 0,
            "status": "running",
            "owner": "A/1",
        },
    }
    assert spec.reply_problems("claim", good) == []
    result = dict(good["result"])  # type: ignore[call-overload]
    del result["owner"]
    no_owner = {**good, "result": result}
    assert any(
        "'owner' is a required property" in p for p in spec.reply_problems("claim", no_owner)
    )
    assert spec.reply_problems("claim", {"id": 1, "ok": False, "error": "NotClaimable"}) == []
    assert spec.reply_problems("claim", {"id": 1, "ok": False}) != []
    idle = {"id": 2, "ok": True, "result": {"operation_id": None, "status": None}}
    assert spec.reply_problems("dispatch", idle) == []


def test_history_lines_judged_by_the_schema() -> None:
    line = {"time": 1.5, "worker": "A", "pid": 7, "type": "ok", "op": "claim", "detail": {}}
    assert spec.history_problems(line) == []
    assert spec.history_problems({**line, "type": "done"}) != []
    assert spec.history_problems({k: v for k, v in line.items() if k != "pid"}) != []


def _runs_table(**columns: Column) -> Table:
    base = {
        "run_id": Column("uuid", True),
        "tenant_id": Column("uuid", True),
        "revision": Column("bigint", True),
    }
    return Table(
        "agent_runs",
        {**base, **columns},
        keys={frozenset({"run_id"})},
        rls=True,
        forced=True,
        policies=[
            {
                "policyname": "p",
                "cmd": "ALL",
                "qual": "(tenant_id = fencecheck.session_tenant())",
                "with_check": "",
            }
        ],
    )


def _catalog(*tables: Table) -> Catalog:
    flags = dict.fromkeys(
        ("rolcanlogin", "rolsuper", "rolcreatedb", "rolcreaterole", "rolbypassrls"), False
    )
    return Catalog(
        tables={t.name: t for t in tables},
        roles={r: {"rolname": r, **flags} for r in catalog.GROUP_ROLES},
        memberships=set(),
        session_tenant=[{"args": "", "returns": "uuid", "security_definer": True}],
    )


def test_catalog_allows_extra_columns_and_a_surrogate_key() -> None:
    expected = _catalog(_runs_table())
    mine = _runs_table(id=Column("bigint", True))
    mine.keys = {frozenset({"id"}), frozenset({"run_id"})}
    gaps, _ = catalog.compare(expected, _catalog(mine))
    assert gaps == []


def test_catalog_names_each_difference() -> None:
    expected = _catalog(_runs_table())
    mine = _runs_table(revision=Column("integer", True))
    mine.keys = set()
    mine.forced = False
    mine.policies = [
        {
            "policyname": "old",
            "cmd": "ALL",
            "qual": "(tenant_id = current_setting('app.tenant_id')::uuid)",
            "with_check": "",
        }
    ]
    del mine.columns["tenant_id"]
    found = _catalog(mine)
    found.roles["fencecheck_worker"]["rolcanlogin"] = True
    gaps, _ = catalog.compare(expected, found)
    items = {(g.section, g.item) for g in gaps}
    assert ("6", "column agent_runs.revision") in items
    assert ("6", "column agent_runs.tenant_id") in items
    assert ("6", "key of agent_runs") in items
    assert ("7.1", "group role fencecheck_worker") in items
    # without a tenant column the table is not judged for isolation
    assert not any(g.section == "7.4" for g in gaps)
    scoped = dataclasses.replace(mine, columns={**mine.columns, "tenant_id": Column("uuid", True)})
    gaps, _ = catalog.compare(expected, _catalog(scoped))
    assert {g.item for g in gaps if g.section == "7.4"} == {
        "row level security of public.agent_runs",
        "policies of public.agent_runs",
    }


def test_a_missing_optional_table_is_a_note() -> None:
    optional = Table("operator_actions", {"id": Column("bigint", True)})
    gaps, notes = catalog.compare(_catalog(_runs_table(), optional), _catalog(_runs_table()))
    assert gaps == [] and any("operator_actions" in n for n in notes)


def test_the_contract_page_lists_every_operation_and_point() -> None:
    from pathlib import Path

    from harness.contract.conformance import POINTS

    page = (Path(__file__).resolve().parents[2] / "docs" / "worker-contract.md").read_text()
    section5 = page[page.index("## 5. `ops` mode") : page.index("## 6. ")]
    for o in spec.operations():
        assert f"| `{o.op}`" in section5 and f" | {o.plane} | " in section5, o.op
    section3 = page[page.index("## 3. Control protocol") : page.index("## 4. ")]
    for point in {p for ps in POINTS.values() for p in ps}:
        assert f"| `{point}` |" in section3, point

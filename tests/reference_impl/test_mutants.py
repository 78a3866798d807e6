"""The mutant registry: well formed, one alteration each, loadable by name.

Fast checks only (no database): whether each mutant is really caught is the
matrix's job (``fencecheck run <catchers> --mutant NAME``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from reference_impl.errors import UnknownMutant
from reference_impl.mutants import REGISTRY, Component, Method, Mutant, SqlOverlay, Statement
from reference_impl.mutants.base import METHODS, SLOTS, overridden_methods
from reference_impl.protocol import Protocol, load_protocol
from reference_impl.queries import Queries

NAMES = sorted(REGISTRY)
# README "Trusting the harness: mutants": the breaks the suite must be able to catch,
# by the rule each breaks (issue 6 asks for at least these).
REQUIRED = {
    "renew_ignores_expiry": 1,
    "takeover_keeps_epoch": 1,
    "release_resets_epoch": 1,
    "write_without_lease_check": 2,
    "lease_check_separate_tx": 2,
    "write_without_revision_cas": 3,
    "claim_without_skip_locked": 1,
    "claim_without_row_lock": 1,
    "new_operation_id_on_retry": 5,
    "unknown_resent_as_failure": 5,
    "expired_claim_back_to_prepared": 4,
    "result_ignores_dispatch_claim": 4,
    "cancel_marks_inflight_cancelled": 6,
    "retry_reuses_run_id": 7,
    "heartbeat_failure_ignored": 8,
    "commit_unknown_as_rollback": 9,
    "consumer_without_dedup": 10,
    "sync_warning_as_success": 11,
    "unknown_schema_to_defaults": 13,
    "rls_missing": 12,
}
_FUNCTION = re.compile(r"CREATE\s+OR\s+REPLACE\s+FUNCTION\s+([a-z_]+\.[a-z_]+)\s*\(", re.I)


def test_registry_is_large_enough_and_covers_the_required_breaks() -> None:
    assert len(REGISTRY) >= 18
    missing = {n: r for n, r in REQUIRED.items() if n not in REGISTRY}
    assert not missing, f"required mutants missing: {missing}"
    assert {n: REGISTRY[n].rule for n in REQUIRED} == REQUIRED


@pytest.mark.parametrize("name", NAMES)
def test_mutant_is_well_formed(name: str) -> None:
    m = REGISTRY[name]
    assert isinstance(m, Mutant)
    assert m.name == name
    assert 1 <= m.rule <= 13
    assert m.catchers and all(re.fullmatch(r"[A-W]", c) for c in m.catchers)
    assert len(set(m.catchers)) == len(m.catchers)
    assert len(m.description) > 20
    assert isinstance(m.alteration, Component | Statement | Method | SqlOverlay)


def test_every_rule_named_exists_and_most_rules_are_covered() -> None:
    rules = {m.rule for m in REGISTRY.values()}
    assert rules <= set(range(1, 14))
    assert rules == set(range(1, 14)), f"rules without a mutant: {set(range(1, 14)) - rules}"


@pytest.mark.parametrize("name", NAMES)
def test_load_protocol_builds_the_mutant(name: str) -> None:
    p = load_protocol(name)
    assert isinstance(p, Protocol)
    assert type(p) is not Protocol
    assert p.name == name
    assert p.caught_by == ",".join(REGISTRY[name].catchers)


@pytest.mark.parametrize("name", NAMES)
def test_mutant_changes_exactly_one_place(name: str) -> None:
    """Compare the mutant Protocol with the correct one, attribute by attribute."""
    m = REGISTRY[name]
    mutant, correct = load_protocol(name), Protocol()
    slots = {s for s in SLOTS if getattr(mutant, s) is not getattr(correct, s)}
    statements = {n for n in correct.queries if mutant.queries.sql(n) != correct.queries.sql(n)} | (
        set(mutant.queries) ^ set(correct.queries)
    )
    methods = {n for n in METHODS if n in vars(type(mutant))}
    overlays = list(mutant.sql_overlays)
    changes = len(slots) + len(statements) + len(methods) + len(overlays)
    assert changes == 1, (slots, statements, methods, overlays)
    alt = m.alteration
    if isinstance(alt, Component):
        assert slots == {alt.slot}
        # One method overridden, and it is a method of the class it replaces.
        (method,) = overridden_methods(alt.cls)
        assert hasattr(SLOTS[alt.slot], method)
        assert alt.cls.__bases__ == (SLOTS[alt.slot],)
    elif isinstance(alt, Statement):
        assert statements == {alt.name}
    elif isinstance(alt, Method):
        assert methods == {alt.name}
    else:
        assert overlays == [alt.path]


@pytest.mark.parametrize(
    "name", [n for n in NAMES if isinstance(REGISTRY[n].alteration, SqlOverlay)]
)
def test_sql_overlay_replaces_one_object(name: str) -> None:
    alt = REGISTRY[name].alteration
    assert isinstance(alt, SqlOverlay)
    text = alt.path.read_text(encoding="utf-8")
    assert text.startswith(f"-- MUTANT {name} (rule {REGISTRY[name].rule}):")
    functions = _FUNCTION.findall(text)
    if alt.target.startswith("fencecheck."):
        # One bug may have to change a function and the one it shares the rule
        # with (target "f and g"); each is an existing function, none added.
        targets = alt.target.split(" and ")
        assert sorted(functions) == sorted(targets)
        assert "MUTANT:" in text, "the changed line of the copied function is marked"
        migrations = "".join(
            p.read_text("utf-8")
            for p in sorted((alt.path.parents[2] / "sql" / "migrations").glob("*.sql"))
        )
        for target in targets:
            created = f"CREATE FUNCTION {target}(" in migrations
            renamed = f"RENAME TO {target.removeprefix('fencecheck.')};" in migrations
            assert created or renamed, f"{target} is not a function of the migrations"
    else:
        assert functions == []


def test_overlay_files_all_registered() -> None:
    used = {m.alteration.file for m in REGISTRY.values() if isinstance(m.alteration, SqlOverlay)}
    on_disk = {
        p.name
        for m in REGISTRY.values()
        if isinstance(m.alteration, SqlOverlay)
        for p in m.alteration.path.parent.glob("*.sql")
    }
    assert on_disk == used


def test_statement_mutant_keeps_other_statements() -> None:
    for m in REGISTRY.values():
        if isinstance(m.alteration, Statement):
            assert m.alteration.name in Queries.load()


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(UnknownMutant) as info:
        load_protocol("no_such_mutant")
    message = str(info.value)
    assert "no_such_mutant" in message
    for name in NAMES:
        assert name in message


def test_correct_protocol_without_a_name() -> None:
    assert type(load_protocol(None)) is Protocol
    assert type(load_protocol("")) is Protocol


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rule": 0},
        {"rule": 14},
        {"catchers": ()},
        {"catchers": ("Z",)},
        {"name": "Bad-Name"},
    ],
)
def test_mutant_refuses_bad_records(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "name": "ok_name",
        "rule": 1,
        "catchers": ("K",),
        "description": "a description long enough",
        "alteration": SqlOverlay("renew_ignores_expiry.sql", "fencecheck.renew"),
    }
    fields.update(kwargs)
    with pytest.raises(ValueError):
        Mutant(**fields)  # type: ignore[arg-type]


def test_component_must_extend_the_slot_class() -> None:
    with pytest.raises(ValueError):
        Mutant("bad", 2, ("K",), "a description long enough", Component("writer_cls", dict))


def test_worker_prints_the_registry_as_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "reference_impl.worker", "mutants"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    listed = json.loads(out.stdout)
    assert [d["name"] for d in listed] == list(REGISTRY)
    for d in listed:
        m = REGISTRY[d["name"]]
        assert d["rule"] == m.rule
        assert d["catchers"] == list(m.catchers)
        assert d["description"] == m.description

"""The coverage tables are whole (fast, no processes): S's links x fault kinds,
every cell a variant of S or named as covered by another experiment; T's
boundary points, every one the contract lists crashed at by T or by another
experiment; none both."""

from __future__ import annotations

import re
from pathlib import Path

from scenarios import s_link_faults as s
from scenarios import t_crash_boundaries as t


def test_every_link_and_fault_kind_is_covered_once() -> None:
    assert s.table_gaps() == []


def test_every_variant_declares_its_wait_and_fault() -> None:
    assert len(s.BY_VARIANT) == len(s.FAULTS)
    for f in s.FAULTS:
        assert s.SPEC.fault_for(f.variant) == f.fault
        assert s.SPEC.natural_wait(f.variant) == f.wait_s
    assert s.SPEC.replication_for("replication_blackhole") == "sync"
    assert s.SPEC.replication_for("pg_blackhole") is None


def contract_boundary_points() -> list[str]:
    """The first column of the boundary table in docs/worker-contract.md §3."""
    text = (Path(__file__).resolve().parents[2] / "docs/worker-contract.md").read_text()
    table = text.split("**Boundary points**", 1)[1].split("\n\n", 2)[1]
    return re.findall(r"^\| `([a-z_0-9]+)` \|", table, flags=re.M)


def test_every_boundary_of_the_contract_is_crashed_at_once() -> None:
    points = contract_boundary_points()
    assert len(points) >= 13
    assert t.table_gaps(points) == []
    assert {b.point for b in t.BOUNDARIES} <= set(points)


def test_every_boundary_is_in_one_variant_with_one_crash_per_stage() -> None:
    """A variant crashes at most once per stage (run, relay, consumer); every
    boundary of T's table rides in exactly one variant (a second path to one
    of its points, SECOND_PATHS, in a variant of its own)."""
    placed = [b.point for group in t.VARIANTS.values() for b in group if b in t.BOUNDARIES]
    assert sorted(placed) == sorted(b.point for b in t.BOUNDARIES)
    extra = [b for group in t.VARIANTS.values() for b in group if b not in t.BOUNDARIES]
    assert extra == list(t.SECOND_PATHS)
    assert {b.point for b in extra} <= {b.point for b in t.BOUNDARIES}
    for variant, group in t.VARIANTS.items():
        stages = [b.stage for b in group]
        assert stages[0] == "run" and len(set(stages)) == len(stages), variant
        assert t.SPEC.injection_point_for(variant) == ", ".join(b.point for b in group)

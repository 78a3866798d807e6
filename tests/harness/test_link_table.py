"""S's table of links x fault kinds is whole: every cell a variant of S or named
as covered by another experiment, none both (fast, no processes)."""

from __future__ import annotations

from scenarios import s_link_faults as s


def test_every_link_and_fault_kind_is_covered_once() -> None:
    assert s.table_gaps() == []


def test_every_variant_declares_its_wait_and_fault() -> None:
    assert len(s.BY_VARIANT) == len(s.FAULTS)
    for f in s.FAULTS:
        assert s.SPEC.fault_for(f.variant) == f.fault
        assert s.SPEC.natural_wait(f.variant) == f.wait_s
    assert s.SPEC.replication_for("replication_blackhole") == "sync"
    assert s.SPEC.replication_for("pg_blackhole") is None

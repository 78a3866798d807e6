"""The harness's model on the reference schema (harness/model, installed from the
reference worker's own mapping): the audit trigger on every table it names,
the statement and session of each change, the model's views, and neither out
of reach of the worker role's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness.checking.invariants import check, gather
from harness.contract import mapping
from harness.model.entities import RELATIONS
from harness.model.install import install
from harness.parts.postgres import Database
from reference_impl.protected import ProtectedWriter
from reference_impl.runtime import Runtime
from tests.reference_impl.conftest import ROLES, TENANT, cp, new_run, take

REFERENCE = mapping.of_file(
    Path(__file__).resolve().parents[2] / "reference_impl/fencecheck-mapping.yaml"
)


def install_model(db: Database) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        assert install(conn, REFERENCE.model) == []


def query_of(db: Database) -> gather.Query:
    def run(statement: str, params: Any) -> list[dict[str, Any]]:
        return db.query(statement, params)

    return run


@pytest.mark.parametrize("stepped", [False, True])
def test_every_write_audited_with_its_statement(
    ref_db: Database, make_rt: Callable[..., Runtime], stepped: bool
) -> None:
    install_model(ref_db)
    rt = make_rt("A")
    run_id = new_run(rt)
    lease = take(rt, run_id).lease
    ProtectedWriter(rt.session, rt.protocol.queries, stepped=stepped).write(cp(lease, 0))
    changes = gather.changes(query_of(ref_db))
    tables = {c.table for c in changes}
    assert {"agent_tasks", "agent_runs", "agent_checkpoints", "outbox"} <= tables
    (write,) = [c for c in changes if c.table == "agent_checkpoints"]
    marker = "protected_write(" if stepped else "protected_write_fast("
    assert marker in write.statement and write.app == "A"
    assert write.new is not None and write.new["revision"] == 1
    (run_change,) = [c for c in changes if c.txid == write.txid and c.table == "agent_runs"]
    assert run_change.before("revision") == 0 and run_change.after("revision") == 1
    evidence = gather.gather(
        query_of(ref_db),
        tool_export={},
        history=[],
        lease_ttl_ms=10_000,
        write_paths={"fast": "protected_write_fast(", "stepped": "protected_write("},
        asked_write_path="stepped" if stepped else "fast",
    )
    assert set(evidence.tables) == set(RELATIONS)
    broken = {r.name: r.violations for r in check(evidence) if not r.ok}
    assert broken == {}


def test_worker_role_cannot_read_or_write_the_trail(ref_db: Database) -> None:
    install_model(ref_db)
    with psycopg.connect(ref_db.dsn(ROLES[(TENANT, "worker")]), autocommit=True) as conn:
        for statement in (
            "SELECT count(*) FROM fencecheck_audit.changes",
            "SELECT count(*) FROM fencecheck_audit.run_changes",
            "INSERT INTO fencecheck_audit.changes (tbl, op) VALUES ('agent_runs', 'UPDATE')",
            "DELETE FROM fencecheck_audit.changes",
            "SELECT count(*) FROM fencecheck_model.agent_runs",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)

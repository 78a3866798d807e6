"""The observation model on a schema of a system's own (harness/model): a small
queue whose lease is a worker's heartbeat row, mapped by a mapping alone, read
through the model's views and audited as model rows (real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harness.model import spec
from harness.model.install import install, set_lease_ttl
from harness.parts.postgres import Database, PostgresCluster

SCHEMA = """
CREATE TABLE workers (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                      last_heartbeat timestamptz NOT NULL DEFAULT now());
CREATE TABLE jobs (id bigserial PRIMARY KEY, status text NOT NULL DEFAULT 'todo',
                   attempts integer NOT NULL DEFAULT 0,
                   worker_id bigint REFERENCES workers (id) ON DELETE SET NULL);
"""

MODEL: dict[str, Any] = {
    "agent_runs": {
        "table": "jobs",
        "columns": {
            "run_id": "id",
            "task_id": "id",
            "status": {
                "column": "status",
                "values": {"todo": "queued", "doing": "running", "done": "succeeded"},
            },
            "owner": "worker_id",
            "attempt_count": "attempts",
            "lease_expires_at": {
                "plus_ms": "lease_ttl",
                "of": {
                    "lookup": "workers",
                    "key": "id",
                    "via": "worker_id",
                    "column": "last_heartbeat",
                },
            },
        },
    },
}


@pytest.fixture
def queue_db(pg_cluster: PostgresCluster) -> Iterator[Database]:
    db = pg_cluster.create_database()
    try:
        with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
            conn.execute(SCHEMA.encode())
            assert install(conn, spec.parse(MODEL)) == []
        yield db
    finally:
        pg_cluster.drop_database(db.name)


def q(db: Database, statement: str, params: Any = None) -> list[dict[str, Any]]:
    return db.query(statement, params)


def test_the_view_reads_the_lease_from_the_heartbeat_row(queue_db: Database) -> None:
    set_lease_ttl(lambda s, p: q(queue_db, s, p), 30_000)
    q(queue_db, "INSERT INTO workers DEFAULT VALUES")
    q(queue_db, "INSERT INTO jobs (status) VALUES ('todo')")
    (queued,) = q(queue_db, "SELECT * FROM fencecheck_model.agent_runs")
    assert (queued["run_id"], queued["status"], queued["owner"]) == ("1", "queued", None)
    q(queue_db, "UPDATE jobs SET status = 'doing', worker_id = 1")
    (held,) = q(
        queue_db,
        "SELECT r.*, r.lease_expires_at - w.last_heartbeat AS ttl FROM fencecheck_model.agent_runs r"
        " JOIN workers w ON w.id = 1",
    )
    assert (held["status"], held["owner"], held["epoch"]) == ("running", "1", None)
    assert held["ttl"].total_seconds() == 30
    q(queue_db, "UPDATE jobs SET status = 'done'")  # worker_id stays: the model clears the lease
    (done,) = q(queue_db, "SELECT owner, lease_expires_at FROM fencecheck_model.agent_runs")
    assert done == {"owner": None, "lease_expires_at": None}
    # Relations the system lacks read as empty views of the model's shape.
    assert q(queue_db, "SELECT count(*) AS n FROM fencecheck_model.outbox") == [{"n": 0}]


def test_a_heartbeat_is_audited_as_the_move_of_its_runs(queue_db: Database) -> None:
    set_lease_ttl(lambda s, p: q(queue_db, s, p), 1_000)
    q(queue_db, "INSERT INTO workers DEFAULT VALUES")
    q(queue_db, "INSERT INTO jobs (status, worker_id) VALUES ('doing', 1), ('todo', NULL)")
    q(queue_db, "SET application_name = 'A'")
    q(queue_db, "UPDATE workers SET last_heartbeat = now() + interval '5 s' WHERE id = 1")
    rows = q(
        queue_db, "SELECT tbl, op, old, new, base_tbl FROM fencecheck_audit.changes ORDER BY seq"
    )
    assert [(r["tbl"], r["op"], r["base_tbl"]) for r in rows] == [
        ("agent_runs", "INSERT", "jobs"),
        ("agent_runs", "INSERT", "jobs"),
        ("agent_runs", "UPDATE", "workers"),  # only the run the heartbeat moved
    ]
    moved = rows[-1]
    assert moved["old"]["run_id"] == moved["new"]["run_id"] == "1"
    assert moved["old"]["lease_expires_at"] < moved["new"]["lease_expires_at"]


def test_what_the_database_lacks_is_named_by_its_field(pg_cluster: PostgresCluster) -> None:
    db = pg_cluster.create_database()
    try:
        with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
            conn.execute(SCHEMA.encode())
            wrong = {"agent_runs": {**MODEL["agent_runs"]}}
            wrong["agent_runs"]["columns"] = {**MODEL["agent_runs"]["columns"], "epoch": "attempt"}
            found = [str(p) for p in install(conn, spec.parse(wrong))]
        assert found == ["model.agent_runs.columns.epoch: public.jobs has no column attempt"]
    finally:
        pg_cluster.drop_database(db.name)


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"agent_runs": "none"}, "model.agent_runs: every system has runs"),
        ({"agent_runs": {"table": "jobs", "columns": {"owner": "w"}}}, "columns.run_id"),
        ({"agent_runs": {"table": "jobs", "columns": {"bogus": "x"}}}, "columns.bogus"),
        ({"runs": {"table": "jobs"}}, "model.runs: not a relation"),
        (
            {
                "agent_runs": {
                    "table": "j",
                    "columns": {"run_id": "id", "status": {"column": "s", "values": {"a": "done"}}},
                }
            },
            "['done'] are not model statuses",
        ),
    ],
)
def test_a_mapping_problem_names_its_path(section: dict[str, Any], problem: str) -> None:
    with pytest.raises(spec.ModelError) as caught:
        spec.parse(section)
    assert any(problem in p for p in caught.value.problems), caught.value.problems

"""The observation model on a schema of a system's own (harness/model): a small
queue whose lease is a worker's heartbeat row, mapped by a mapping alone, read
through the model's views and audited as model rows (real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harness.checking.invariants import check
from harness.checking.invariants.gather import gather
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


def test_the_evidence_knows_which_model_columns_the_mapping_declares(queue_db: Database) -> None:
    ev = gather(lambda s, p: q(queue_db, s, p), tool_export={}, history=[], lease_ttl_ms=1_000)
    assert ev.declared is not None
    assert ev.declared["agent_runs"] == {
        "run_id",
        "task_id",
        "status",
        "owner",
        "attempt_count",
        "lease_expires_at",
    }
    # A relation the mapping leaves out declares nothing: its invariants are not judged.
    assert ev.declares("tool_operations", "first_dispatched_at") is False
    assert ev.declares("agent_runs", "epoch") is False


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


@pytest.mark.parametrize(
    ("deleted", "problem"),
    [
        ({"status": "done"}, "model.agent_runs.deleted.status: the terminal status"),
        ({"status": "running"}, "model.agent_runs.deleted.status"),
        ({"status": "succeeded", "when": 1}, "model.agent_runs.deleted.when: unknown key"),
        ({"status": "succeeded", "log": {"table": "l"}}, "model.agent_runs.deleted.log.key"),
        (
            {
                "status": "failed",
                "log": {"table": "l", "key": "k", "column": "c", "values": {"x": "gone"}},
            },
            "model.agent_runs.deleted.log.values: ['gone']",
        ),
        ("succeeded", "model.agent_runs.deleted: a mapping with a status"),
    ],
)
def test_a_deleted_section_problem_names_its_field(deleted: Any, problem: str) -> None:
    section = {"agent_runs": {**MODEL["agent_runs"], "deleted": deleted}}
    with pytest.raises(spec.ModelError) as caught:
        spec.parse(section)
    assert any(p.startswith(problem) for p in caught.value.problems), caught.value.problems


def test_only_runs_read_by_their_id_column_may_be_deleted() -> None:
    with pytest.raises(spec.ModelError) as caught:
        spec.parse(
            {
                "agent_runs": {**MODEL["agent_runs"], "deleted": {"status": "succeeded"}},
                "outbox": {"table": "o", "columns": {"id": "id"}, "deleted": {"status": "failed"}},
            }
        )
    assert caught.value.problems == [
        "model.outbox.deleted: only agent_runs may say what a DELETE means"
    ]
    with pytest.raises(spec.ModelError) as caught:
        spec.parse(
            {"agent_runs": {"table": "jobs", "same_names": True, "deleted": {"status": "failed"}}}
        )
    assert caught.value.problems[0].startswith("model.agent_runs.deleted: a same_names relation")


# A queue that moves a finished job into a log table in one statement (as
# pgqueuer's log_jobs does), and leaves a failed one in place.
LOGGED = """
CREATE TABLE job_log (id bigserial PRIMARY KEY, job_id bigint NOT NULL, status text NOT NULL);
"""
FINISH = """
WITH gone AS (DELETE FROM jobs WHERE id = %s RETURNING id)
INSERT INTO job_log (job_id, status) SELECT id, %s FROM gone
"""
DELETED: dict[str, Any] = {
    "status": "succeeded",
    "log": {
        "table": "job_log",
        "key": "job_id",
        "column": "status",
        "latest": "id",
        "values": {"ok": "succeeded", "cancel": "cancelled", "boom": "failed"},
    },
}


@pytest.fixture
def deleting_db(pg_cluster: PostgresCluster) -> Iterator[Database]:
    db = pg_cluster.create_database()
    try:
        with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
            conn.execute((SCHEMA + LOGGED).encode())
            model = spec.parse({"agent_runs": {**MODEL["agent_runs"], "deleted": DELETED}})
            assert install(conn, model) == []
        yield db
    finally:
        pg_cluster.drop_database(db.name)


def test_a_deleted_run_stays_in_the_model_ended_with_its_logged_status(
    deleting_db: Database,
) -> None:
    db = deleting_db
    set_lease_ttl(lambda s, p: q(db, s, p), 30_000)
    q(db, "INSERT INTO workers DEFAULT VALUES")
    q(db, "INSERT INTO jobs (status, worker_id) VALUES ('doing', 1), ('doing', 1), ('doing', 1)")
    q(db, "SET application_name = 'A'")
    q(db, FINISH, [1, "cancel"])
    q(db, "INSERT INTO job_log (job_id, status) VALUES (2, 'picked')")
    q(db, FINISH, [2, "unheard-of"])  # not a status the mapping knows: the fixed one
    q(db, "DELETE FROM jobs WHERE id = 3")  # no log row at all: the fixed one
    runs = q(db, "SELECT run_id, status, owner, lease_expires_at FROM fencecheck_model.agent_runs")
    assert sorted((r["run_id"], r["status"], r["owner"], r["lease_expires_at"]) for r in runs) == [
        ("1", "cancelled", None, None),
        ("2", "succeeded", None, None),
        ("3", "succeeded", None, None),
    ]
    rows = q(
        db,
        "SELECT op, app, old, new, base_tbl, base_new, statement FROM fencecheck_audit.changes"
        " WHERE op <> 'INSERT' ORDER BY seq",
    )
    assert [(r["op"], r["app"], r["base_tbl"], r["base_new"]) for r in rows] == [
        ("UPDATE", "A", "jobs", None)
    ] * 3
    first = rows[0]
    assert (first["old"]["status"], first["old"]["owner"]) == ("running", "1")
    assert (first["new"]["status"], first["new"]["owner"]) == ("cancelled", None)
    assert first["new"]["run_id"] == "1" and "DELETE FROM jobs" in first["statement"]


def test_a_live_row_of_a_deleted_id_hides_its_ended_row(deleting_db: Database) -> None:
    db = deleting_db
    q(db, "INSERT INTO jobs (status) VALUES ('todo')")
    q(db, FINISH, [1, "boom"])
    q(db, "INSERT INTO jobs (id, status) OVERRIDING SYSTEM VALUE VALUES (1, 'todo')")
    (run,) = q(db, "SELECT run_id, status FROM fencecheck_model.agent_runs")
    assert (run["run_id"], run["status"]) == ("1", "queued")


def test_a_missing_log_column_is_named_by_its_field(pg_cluster: PostgresCluster) -> None:
    db = pg_cluster.create_database()
    try:
        with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
            conn.execute((SCHEMA + LOGGED).encode())
            wrong = {**DELETED, "log": {**DELETED["log"], "latest": "created"}}
            model = spec.parse({"agent_runs": {**MODEL["agent_runs"], "deleted": wrong}})
            found = [str(p) for p in install(conn, model)]
        assert found == [
            "model.agent_runs.deleted.log.latest: public.job_log has no column created"
        ]
    finally:
        pg_cluster.drop_database(db.name)


@pytest.mark.parametrize(
    ("finisher", "broken"), [("B", []), ("A", ["lease.live_lease_moved_only_by_its_holder"])]
)
def test_a_delete_is_judged_as_a_finish_by_the_deleting_session(
    deleting_db: Database, finisher: str, broken: list[str]
) -> None:
    """A's lease expires, B takes the job over and keeps it live; the DELETE of
    the job's row by B is a finish like any, by A a stale completion that landed."""
    db = deleting_db
    set_lease_ttl(lambda s, p: q(db, s, p), 1_000)
    with (
        psycopg.connect(db.admin_dsn, autocommit=True) as a,
        psycopg.connect(db.admin_dsn, autocommit=True) as b,
    ):
        a.execute("SET application_name = 'A'")
        b.execute("SET application_name = 'B'")
        a.execute("INSERT INTO workers DEFAULT VALUES")
        b.execute("INSERT INTO workers DEFAULT VALUES")
        a.execute("INSERT INTO jobs (status) VALUES ('todo')")
        a.execute("UPDATE jobs SET status = 'doing', worker_id = 1")
        a.execute("UPDATE workers SET last_heartbeat = now() - interval '5 s' WHERE id = 1")
        b.execute("UPDATE jobs SET worker_id = 2")  # the takeover of an expired lease
        (a if finisher == "A" else b).execute(FINISH.encode(), [1, "ok"])

    def query(statement: str, params: Any) -> list[dict[str, Any]]:
        return q(db, statement, params)

    evidence = gather(query, tool_export={}, history=[], lease_ttl_ms=1_000)
    results = check(evidence)
    assert [r.name for r in results if r.broken] == broken
    (run,) = evidence.rows("agent_runs")
    assert (run["status"], run["owner"]) == ("succeeded", None)

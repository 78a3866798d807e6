"""Rules 2, 3, 9: protected writes, same-epoch ordering, commit-outcome read-back."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from harness.parts.postgres import Database
from reference_impl import errors as e
from reference_impl.leases import Lease
from reference_impl.protected import ProtectedWriter, ReadBack, Write, Written, _CommitUnknown
from reference_impl.runtime import Runtime
from tests.reference_impl.conftest import cp, new_run, operator_of, take


def _count(db: Database, run: uuid.UUID) -> tuple[int, int]:
    c = db.query("SELECT count(*) AS n FROM agent_checkpoints WHERE run_id = %s", [run])[0]["n"]
    o = db.query("SELECT count(*) AS n FROM outbox WHERE run_id = %s", [run])[0]["n"]
    return int(c), int(o)


@pytest.mark.parametrize("stepped", [False, True])
def test_sequential_writes_advance_revision_by_one(
    rt: Runtime, ref_db: Database, stepped: bool
) -> None:
    """Experiment A, in both shapes of the protected write."""
    rt.writer.stepped = stepped
    run = new_run(rt)
    lease = take(rt, run).lease
    first = rt.writer.write(cp(lease, 0))
    second = rt.writer.write(cp(lease, 1))
    assert (first.revision, second.revision) == (1, 2)
    rows = ref_db.query(
        "SELECT revision, epoch, owner, schema_version FROM agent_checkpoints"
        " WHERE run_id = %s ORDER BY revision",
        [run],
    )
    assert [r["revision"] for r in rows] == [1, 2]
    assert all(r["epoch"] == lease.epoch and r["owner"] == lease.owner for r in rows)
    assert _count(ref_db, run) == (2, 2)


def test_same_expected_revision_exactly_one_wins(
    make_rt: Callable[..., Runtime], ref_db: Database
) -> None:
    """Experiment C: two concurrent writes with the same expected revision."""
    a, a2 = make_rt("A"), make_rt("A")
    run = new_run(a)
    lease = take(a, run).lease
    results: list[Any] = []

    def go(r: Runtime) -> None:
        try:
            results.append(r.writer.write(cp(lease, 0)))
        except e.RevisionConflict as exc:
            results.append(exc)

    threads = [threading.Thread(target=go, args=(r,)) for r in (a, a2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert sorted(type(r).__name__ for r in results) == ["RevisionConflict", "Written"]
    assert a.runs.state(a.conn, run)["revision"] == 1
    assert _count(ref_db, run) == (1, 1)


def test_stale_owner_rejected_after_takeover(
    make_rt: Callable[..., Runtime], ref_db: Database
) -> None:
    """Experiment B at the API level: A's save, renew, release all rejected."""
    a, b = make_rt("A"), make_rt("B")
    run = new_run(a)
    la = take(a, run, ttl_ms=100).lease
    time.sleep(0.15)
    lb = take(b, run).lease
    b.writer.write(cp(lb, 0, {"by": "B"}))
    with pytest.raises(e.LeaseLost) as err:
        a.writer.write(cp(la, 1, {"by": "A"}))
    assert err.value.reason == "lost"
    assert not a.leases.renew(a.conn, la, 1000).ok
    assert a.leases.release(a.conn, la) == "lost"
    st = b.runs.state(b.conn, run)
    assert (st["epoch"], st["owner"], st["revision"]) == (lb.epoch, lb.owner, 1)


def test_expired_lease_rejected_without_takeover(rt: Runtime, ref_db: Database) -> None:
    """Experiment K: the expiry check, not a newer epoch, rejects the write."""
    run = new_run(rt)
    lease = take(rt, run, ttl_ms=100).lease
    time.sleep(0.15)
    with pytest.raises(e.LeaseLost) as err:
        rt.writer.write(cp(lease, 0))
    assert err.value.reason == "expired"
    assert rt.runs.state(rt.conn, run)["epoch"] == lease.epoch
    assert _count(ref_db, run) == (0, 0)


def test_wrong_revision_and_lost_lease_never_write_terminal(rt: Runtime) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    with pytest.raises(e.RevisionConflict):
        rt.writer.write(cp(lease, 5))
    stale = Lease(run, "someone-else", lease.epoch)
    with pytest.raises(e.LeaseLost):
        rt.writer.write(cp(stale, 0, transition="succeed", payload={"reason": "x"}))
    assert rt.runs.state(rt.conn, run)["status"] == "running"


def test_terminal_state_clears_lease_keeps_epoch_and_is_final(
    rt: Runtime, ref_db: Database
) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    out = rt.writer.write(cp(lease, 0, transition="fail", payload={"reason": "bad input"}))
    assert out.status == "failed"
    row = ref_db.query(
        "SELECT status, owner, lease_expires_at, epoch, terminal_reason"
        " FROM agent_runs WHERE run_id = %s",
        [run],
    )[0]
    assert row["owner"] is None and row["lease_expires_at"] is None
    assert row["epoch"] == lease.epoch and row["terminal_reason"] == "bad input"
    with pytest.raises(Exception, match="terminal"):
        ref_db.query("UPDATE agent_runs SET status = 'running' WHERE run_id = %s", [run])


def test_requeue_backoff_and_attempt_budget(rt: Runtime) -> None:
    ctl = operator_of(rt)
    out = ctl.runs.create(ctl.conn, "t-budget", {}, max_attempts=1)
    run = uuid.UUID(out["run_id"])
    lease = take(rt, run).lease
    w = cp(lease, 0, transition="requeue", effect={"backoff_ms": 60_000}, payload={})
    assert rt.writer.write(w).status == "failed"  # attempt 1 of 1 used: no more retries
    out2 = ctl.runs.create(ctl.conn, "t-backoff", {}, max_attempts=5)
    run2 = uuid.UUID(out2["run_id"])
    lease2 = take(rt, run2).lease
    assert (
        rt.writer.write(
            cp(lease2, 0, transition="requeue", effect={"backoff_ms": 60_000}, payload={})
        ).status
        == "queued"
    )
    assert rt.leases.takeover(rt.conn, run2, rt.owner, 1000).outcome == "not_due"


# ------------------------------------------------------------------ rule 9


class _LostAnswer(ProtectedWriter):
    """Commits (or not, as the test decides) and then 'loses' the answer."""

    decide: Callable[[Write], None] = staticmethod(lambda w: None)
    fail_times = 1

    def _attempt(self, w: Write) -> Written:
        if self.fail_times > 0:
            self.fail_times -= 1
            self.decide(w)
            raise _CommitUnknown("connection lost during COMMIT (simulated)")
        return super()._attempt(w)


def _lost_writer(rt: Runtime, decide: Callable[[Write], None]) -> _LostAnswer:
    w = _LostAnswer(rt.session, rt.protocol.queries)
    w.stepped = False
    w.decide = decide
    return w


def test_unknown_commit_that_committed_is_not_repeated(rt: Runtime, ref_db: Database) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    real = ProtectedWriter(rt.session_for(), rt.protocol.queries, stepped=False)

    def commit(w: Write) -> None:
        real.write(w)

    writer = _lost_writer(rt, commit)
    out = writer.write(cp(lease, 0))
    assert out.read_back and out.revision == 1
    assert _count(ref_db, run) == (1, 1)  # no duplicate event


def test_unknown_commit_that_did_not_commit_is_retried_with_same_event(
    rt: Runtime, ref_db: Database
) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    w = cp(lease, 0)
    writer = _lost_writer(rt, lambda _: None)
    out = writer.write(w)
    assert out.revision == 1 and out.event_id == w.event_id and not out.read_back
    ids = ref_db.query("SELECT event_id FROM outbox WHERE run_id = %s", [run])
    assert [r["event_id"] for r in ids] == [w.event_id]


@pytest.mark.parametrize("keep", ["checkpoint", "outbox"])
def test_unknown_commit_half_present_is_inconsistent(
    rt: Runtime, ref_db: Database, keep: str
) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    real = ProtectedWriter(rt.session_for(), rt.protocol.queries, stepped=False)

    def half(w: Write) -> None:
        real.write(w)
        gone = "outbox" if keep == "checkpoint" else "agent_checkpoints"
        ref_db.query(f"DELETE FROM {gone} WHERE event_id = %s", [w.event_id])

    with pytest.raises(e.CommitInconsistent):
        _lost_writer(rt, half).write(cp(lease, 0))
    assert rt.writer.read_back(cp(lease, 0)) is ReadBack.NOT_COMMITTED


def test_commit_warning_is_not_durable_success(rt: Runtime, ref_db: Database) -> None:
    """Rule 11: a write answered with a WARNING (as the cancelled sync-rep wait is)
    raises CommitOutcomeUnknown(durability_unconfirmed), never returns success."""
    ref_db.query(
        "CREATE FUNCTION public.warn_once() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE WARNING 'simulated: canceling wait for synchronous replication';"
        " RETURN NEW; END $$;"
        " CREATE TRIGGER warn AFTER INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION warn_once()"
    )
    run = new_run(rt)
    lease = take(rt, run).lease
    with pytest.raises(e.CommitOutcomeUnknown) as err:
        rt.writer.write(cp(lease, 0))
    assert err.value.reason == "durability_unconfirmed"


def test_serialization_failure_is_retried_within_budget(rt: Runtime) -> None:
    import psycopg

    run = new_run(rt)
    lease = take(rt, run).lease

    class Flaky(ProtectedWriter):
        n = 0

        def _attempt(self, w: Write) -> Written:
            Flaky.n += 1
            if Flaky.n <= 2:
                raise psycopg.errors.SerializationFailure("simulated 40001")
            return super()._attempt(w)

    assert Flaky(rt.session, rt.protocol.queries, stepped=False).write(cp(lease, 0)).revision == 1
    Flaky.n = -100
    with pytest.raises(e.SerializationBudgetExceeded):
        Flaky(rt.session, rt.protocol.queries, stepped=False, serialization_budget=3).write(
            cp(lease, 1)
        )

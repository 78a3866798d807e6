"""Rule 1: acquire/takeover only when free or expired (epoch + 1); renew only
while owner, epoch match and unexpired; release keeps the epoch; zero rows
are distinguished and never a task failure."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from harness.parts.postgres import Database
from reference_impl.leases import Grant
from reference_impl.runtime import Runtime
from tests.reference_impl.conftest import cp, new_run, take, wait_until_blocked_on_lock


def test_claim_grants_epoch_plus_one_and_skips_held(make_rt: Callable[..., Runtime]) -> None:
    a, b = make_rt("A"), make_rt("B")
    run = new_run(a)
    g = a.leases.claim(a.conn, a.owner, 10_000)
    assert g.acquired and g.run_id == run and g.epoch == 1 and g.status == "running"
    assert b.leases.claim(b.conn, b.owner, 10_000).outcome == "none"


def test_claim_skips_locked_rows(make_rt: Callable[..., Runtime]) -> None:
    a, b = make_rt("A"), make_rt("B")
    r1, r2 = new_run(a), new_run(a)
    with a.conn.transaction():
        g1 = a.leases.claim(a.conn, a.owner, 10_000)  # row lock held until commit
        g2 = b.leases.claim(b.conn, b.owner, 10_000)  # must not wait
        assert {g1.run_id, g2.run_id} == {r1, r2}


def test_expired_lease_is_taken_over_with_epoch_plus_one(make_rt: Callable[..., Runtime]) -> None:
    a, b = make_rt("A"), make_rt("B")
    run = new_run(a)
    ga = take(a, run, ttl_ms=100)
    assert b.leases.takeover(b.conn, run, b.owner, 10_000).outcome == "held"
    time.sleep(0.15)
    gb = b.leases.claim(b.conn, b.owner, 10_000)
    assert gb.acquired and gb.epoch == (ga.epoch or 0) + 1 and gb.previous_owner == a.owner
    assert gb.expired_for_ms is not None and gb.expired_for_ms > 0


def test_renew_requires_owner_epoch_and_unexpired(make_rt: Callable[..., Runtime]) -> None:
    a, b = make_rt("A"), make_rt("B")
    run = new_run(a)
    lease = take(a, run, ttl_ms=150).lease
    assert a.leases.renew(a.conn, lease, 150).ok
    wrong = type(lease)(lease.run_id, b.owner, lease.epoch)
    assert a.leases.renew(a.conn, wrong, 150).outcome == "lost"
    stale = type(lease)(lease.run_id, lease.owner, lease.epoch - 1)
    assert a.leases.renew(a.conn, stale, 150).outcome == "lost"
    time.sleep(0.2)
    # Expired but nobody took over: still refused (experiment K).
    assert a.leases.renew(a.conn, lease, 10_000).outcome == "expired"
    missing = type(lease)(uuid.uuid4(), lease.owner, 1)
    assert a.leases.renew(a.conn, missing, 100).outcome == "missing"


def test_release_keeps_epoch_and_requeues(make_rt: Callable[..., Runtime]) -> None:
    a, b = make_rt("A"), make_rt("B")
    run = new_run(a)
    lease = take(a, run).lease
    assert a.leases.release(a.conn, lease) == "released"
    st = a.runs.state(a.conn, run)
    assert st["status"] == "queued" and st["epoch"] == lease.epoch and st["owner"] is None
    assert a.leases.release(a.conn, lease) == "lost"
    assert take(b, run).epoch == lease.epoch + 1


def test_takeover_outcomes(make_rt: Callable[..., Runtime]) -> None:
    a = make_rt("A")
    assert a.leases.takeover(a.conn, uuid.uuid4(), a.owner, 1000).outcome == "missing"
    run = new_run(a)
    lease = take(a, run).lease
    a.writer.write(cp(lease, 0, transition="succeed", payload={"reason": "done"}))
    assert a.leases.takeover(a.conn, run, a.owner, 1000).outcome == "terminal"


def test_takeover_waits_for_row_lock_holder(
    make_rt: Callable[..., Runtime], ref_db: Database
) -> None:
    """Experiment D: B's targeted takeover waits for A's transaction to end."""
    a, b = make_rt("A"), make_rt("B")
    run = new_run(a)
    lease = take(a, run, ttl_ms=200).lease
    done: list[tuple[float, Grant]] = []
    a.conn.execute("BEGIN")
    a.conn.execute(
        a.protocol.queries.sql("lock_lease"),
        {"run_id": run, "owner": lease.owner, "epoch": lease.epoch},
    )
    time.sleep(0.25)  # lease now expired, but A holds the row lock
    b_pid = b.conn.info.backend_pid  # B's session connection, opened here, not in the thread

    def other() -> None:
        g = b.leases.takeover(b.conn, run, b.owner, 10_000)
        done.append((time.monotonic(), g))

    t = threading.Thread(target=other)
    t.start()
    wait_until_blocked_on_lock(ref_db, b_pid)
    assert not done, "takeover did not wait for the lock holder"
    # Hold the lock a while longer, so that lock_wait_ms > 100 below is
    # the wait the server measured, not a coincidence of scheduling.
    time.sleep(0.15)
    assert not done, "takeover did not wait for the lock holder"
    released = time.monotonic()
    a.conn.execute("ROLLBACK")
    t.join(5)
    assert not t.is_alive(), "the takeover did not finish after the lock holder let go"
    assert len(done) == 1
    finished, g = done[0]
    assert finished >= released
    assert g.acquired and g.epoch == lease.epoch + 1 and g.lock_wait_ms and g.lock_wait_ms > 100

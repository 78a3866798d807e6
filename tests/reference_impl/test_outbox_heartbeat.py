"""Rules 8, 10, 11: outbox relay and consumer dedup; heartbeat cancels;
durability contract."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from harness.parts.postgres import Database
from harness.waiting import wait_for
from reference_impl.cancellation import Cancellation
from reference_impl.durability import read_contract
from reference_impl.errors import ExecutionCancelled
from reference_impl.heartbeat import Heartbeat
from reference_impl.outbox import Relay
from reference_impl.runtime import Runtime
from tests.reference_impl.conftest import TENANT, cp, new_run, take


class FakeBroker:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.fail_after: int | None = None

    def publish(self, event_id: str, topic: str, payload: Any) -> int:
        if self.fail_after is not None and len(self.messages) >= self.fail_after:
            raise ConnectionError("broker down")
        self.messages.append(
            {
                "seq": len(self.messages) + 1,
                "event_id": event_id,
                "topic": topic,
                "payload": payload,
            }
        )
        return len(self.messages)

    def broker_messages(self, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["seq"] > after]


class FakeTools:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker


def test_relay_at_least_once_and_consumer_dedups(rt: Runtime, ref_db: Database) -> None:
    """Experiment L: a message may repeat; the consumer's effect happens once."""
    run = new_run(rt)
    lease = take(rt, run).lease
    rt.writer.write(cp(lease, 0, payload={"tenant_id": TENANT}))
    rt.writer.write(cp(lease, 1, payload={"tenant_id": TENANT}))
    broker = FakeBroker()
    relay = Relay(rt.protocol.queries, FakeTools(broker))  # type: ignore[arg-type]
    # Crash after the broker's ack, before the mark: simulated by a rollback.
    try:
        with rt.conn.transaction():
            rows = rt.conn.execute(
                rt.protocol.queries.sql("outbox_lock_batch"), {"limit": 10}
            ).fetchall()
            for r in rows:
                broker.publish(str(r["event_id"]), r["event_type"], dict(r["payload"]))
            raise RuntimeError("crash before marking")
    except RuntimeError:
        pass
    published = relay.cycle(rt.conn)
    assert len(published) == 2 and len(broker.messages) == 4  # each event twice
    assert relay.cycle(rt.conn) == []
    consumer = rt.protocol.consumer_cls(rt.protocol.queries, FakeTools(broker), TENANT)  # type: ignore[arg-type]
    assert consumer.cycle(rt.conn, "c1") == {"consumed": 2, "duplicates": 2}
    effects = ref_db.query("SELECT event_id, count(*) AS n FROM consumer_effects GROUP BY 1")
    assert len(effects) == 2 and all(r["n"] == 1 for r in effects)


def test_relay_marks_only_acknowledged(rt: Runtime, ref_db: Database) -> None:
    run = new_run(rt)
    lease = take(rt, run).lease
    for i in range(3):
        rt.writer.write(cp(lease, i))
    broker = FakeBroker()
    broker.fail_after = 1
    assert len(Relay(rt.protocol.queries, FakeTools(broker)).cycle(rt.conn)) == 1  # type: ignore[arg-type]
    pending = ref_db.query("SELECT count(*) AS n FROM outbox WHERE published_at IS NULL")
    assert pending[0]["n"] == 2


def test_heartbeat_renews_then_cancels_when_unconfirmed(make_rt: Callable[..., Runtime]) -> None:
    a, b = make_rt("A"), make_rt("B")
    run = new_run(a)
    lease = take(a, run, ttl_ms=300).lease
    cancel = Cancellation()
    hb = a.heartbeat(lease, cancel, interval_ms=50, timeout_ms=500)
    hb.ttl_ms = 300
    hb.start()
    time.sleep(0.5)  # past the original TTL: renewals kept it alive
    assert not cancel.cancelled and hb.last_outcome == "renewed"
    assert b.leases.takeover(b.conn, run, b.owner, 1000).outcome == "held"
    # Another session fences A out (release + takeover): next renewal is lost.
    a.leases.release(a.conn, lease)
    take(b, run)
    try:
        wait_for(lambda: cancel.cancelled, what="the heartbeat to cancel", timeout_s=3)
    finally:
        hb.stop()
    assert cancel.cancelled and cancel.cause == "lease renewal lost"


def test_heartbeat_timeout_is_unconfirmed(
    make_rt: Callable[..., Runtime], ref_db: Database
) -> None:
    a = make_rt("A")
    run = new_run(a)
    lease = take(a, run).lease
    # Hold the row lock elsewhere so the renewal blocks past its timeout.
    blocker = ref_db.cluster.connect(ref_db.name, autocommit=False)
    blocker.execute("SELECT 1 FROM agent_runs WHERE run_id = %s FOR UPDATE", [run])
    cancel = Cancellation()
    hb = a.heartbeat(lease, cancel, interval_ms=20, timeout_ms=200).start()
    try:
        # The lock is held for the whole wait: a cancel seen here came from
        # the renewal's own timeout, not from the renewal finally going through.
        wait_for(lambda: cancel.cancelled, what="the heartbeat to cancel", timeout_s=20)
    finally:
        blocker.rollback()
        blocker.close()
        hb.stop()
    assert cancel.cancelled and "unknown" in str(cancel.cause)


def test_durability_contract_without_standby(rt: Runtime) -> None:
    c = read_contract(rt.conn, rt.protocol.queries)
    assert c.mode == "none" and "no standby" in c.guarantee
    assert c.settings["synchronous_commit"] in (
        "on",
        "local",
        "off",
        "remote_write",
        "remote_apply",
    )


def test_cancellation_token() -> None:
    c = Cancellation()
    c.check()
    threading.Timer(0.05, c.cancel, args=("x",)).start()
    t0 = time.monotonic()
    with pytest.raises(ExecutionCancelled) as err:
        c.sleep(120)
    assert type(err.value) is ExecutionCancelled
    # The sleep ended at the cancel, not at its end (far from it on any machine).
    assert time.monotonic() - t0 < 60


def test_heartbeat_connects_before_its_first_renewal(
    make_rt: Callable[..., Runtime], ref_db: Database
) -> None:
    """A renewal's timeout bounds the renewal, not a TCP connect and a login:
    the heartbeat's session opens before its first tick (blind hunt 61's
    reader found the first renewal connecting inside its bound)."""
    a = make_rt("A")
    run = new_run(a)
    lease = take(a, run).lease

    def sessions() -> int:
        rows = ref_db.query(
            "SELECT count(*) AS n FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(rows[0]["n"])

    before = sessions()
    hb = a.heartbeat(lease, Cancellation(), interval_ms=60_000, timeout_ms=500).start()
    try:
        wait_for(
            lambda: sessions() > before,
            what="the heartbeat's session to open before its first renewal",
            timeout_s=10,
        )
        assert hb.last_outcome is None  # no renewal yet: the first tick is a minute away
    finally:
        hb.stop()


def test_a_renewal_that_fails_with_any_error_cancels(make_rt: Callable[..., Runtime]) -> None:
    """Not only the driver's errors leave a renewal unconfirmed: a renewal
    that raises anything else (a reconnect refused for its tenant binding)
    must cancel the work, not kill the heartbeat's thread with the work
    going on (blind hunt 68's reader)."""
    a = make_rt("A")
    run = new_run(a)
    lease = take(a, run).lease
    cancel = Cancellation()
    hb = a.heartbeat(lease, cancel, interval_ms=20, timeout_ms=500)

    def refused(*_: object) -> None:
        raise RuntimeError("this login role is bound to another tenant")

    hb.leases.renew = refused  # type: ignore[method-assign,assignment]
    _cancels_unconfirmed(hb, cancel)


def _cancels_unconfirmed(hb: Heartbeat, cancel: Cancellation) -> None:
    """Start ``hb``: it must cancel the work for an unconfirmed renewal."""
    hb.start()
    try:
        wait_for(lambda: cancel.cancelled, what="the heartbeat to cancel", timeout_s=10)
    finally:
        hb.stop()
    assert cancel.cancelled and "unknown" in str(cancel.cause)


class _DarkLink:
    """A session whose connect never answers (a link black-holed mid-login,
    the tenant check sent: no timeout of the driver's ends that wait)."""

    def __init__(self) -> None:
        self.gone = threading.Event()

    @property
    def conn(self) -> object:
        self.gone.wait()
        raise ConnectionError("the link went dark")

    def discard(self) -> None:
        pass

    def close(self) -> None:
        self.gone.set()


def test_a_connect_that_never_answers_still_cancels(make_rt: Callable[..., Runtime]) -> None:
    """The heartbeat's early connect hangs on a dark link: its renewals must
    still come, each unconfirmed within its bound, and cancel the work (CI at
    1d666b4: the loop waited on that connect, never renewed, and the worker
    of S[pg_blackhole_mid_step] hung on its own dead statement)."""
    a = make_rt("A")
    run = new_run(a)
    lease = take(a, run).lease
    cancel = Cancellation()
    hb = a.heartbeat(lease, cancel, interval_ms=50, timeout_ms=300)
    dark = _DarkLink()
    hb._session = dark  # type: ignore[assignment]
    _cancels_unconfirmed(hb, cancel)

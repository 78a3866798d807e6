"""The protected write's two shapes give the same outcomes (rules 2, 3, 4, 12).

The fast path (``fencecheck.protected_write_fast``, one autocommit call that
locks and validates inline) and the stepped path the harness runs
(``lock_lease`` then ``protected_write``, which calls ``lock_lease`` again)
are separate SQL. Every scenario here runs once per shape on runs prepared the
same way, and both must end with the same answers, the same rejections and
the same rows. Also: the fast path takes the row lock before it validates,
and it is as closed to the worker role as the rest of the API.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from harness.parts.postgres import Database
from harness.waiting import WaitTimeout
from reference_impl import db
from reference_impl import errors as e
from reference_impl.ids import canonical_json, state_hash
from reference_impl.leases import Lease
from reference_impl.ledger import intent_effect
from reference_impl.protected import ProtectedWriter, Write
from reference_impl.runtime import Runtime
from reference_impl.sqlstate import outcome_unknown
from tests.reference_impl.conftest import (
    OTHER_TENANT,
    TENANT,
    cp,
    new_run,
    operator_of,
    take,
    wait_until_blocked_on_lock,
)

SHAPES = ("fast", "stepped")
REQUEST = {"order_id": "o1", "amount": 10}


class Case:
    """One scenario: a run (made by ``setup``) and the steps written against it."""

    def __init__(self, rt: Runtime, shape: str, max_attempts: int = 12, ttl_ms: int = 10_000):
        self.rt = rt
        self.writer = ProtectedWriter(rt.session, rt.protocol.queries, stepped=shape == "stepped")
        ctl = operator_of(rt)
        out = ctl.runs.create(
            ctl.conn, f"task-{uuid.uuid4().hex[:8]}", {}, max_attempts=max_attempts
        )
        self.run = uuid.UUID(out["run_id"])
        self.lease = take(rt, self.run, ttl_ms=ttl_ms).lease
        self.answers: list[tuple[Any, ...]] = []

    def write(self, w: Write) -> None:
        try:
            out = self.writer.write(w)
        except e.ProtocolError as exc:
            self.answers.append((type(exc).__name__, exc.reason))
        else:
            self.answers.append(("ok", out.revision, out.status, out.ledger_status))

    def op_id(self) -> str:
        return self.rt.protocol.operation_id(TENANT, str(self.run), "create_label", 1)

    def intent(self, rev: int, request: dict[str, Any] | None = None) -> None:
        effect = intent_effect(
            self.op_id(), "create_label", 1, "idem", "idempotent", request or REQUEST
        )
        self.write(cp(self.lease, rev, transition="intent", effect=effect))

    def claim(self) -> dict[str, Any]:
        op = self.rt.ledger.claim(self.rt.conn, "D1", self.op_id())
        assert op is not None
        return {
            "operation_id": op.operation_id,
            "dispatch_owner": "D1",
            "ledger_revision": op.revision,
            "request_digest": op.request_digest,
        }

    def rows(self, db: Database) -> dict[str, Any]:
        """What the writes left, without ids and times."""
        run = db.query(
            "SELECT status, revision, owner IS NOT NULL AS owned, epoch,"
            " lease_expires_at IS NOT NULL AS leased, next_attempt_at > now() AS backoff,"
            " attempt_count, current_step, checkpoint_schema_version, terminal_reason"
            " FROM agent_runs WHERE run_id = %s",
            [self.run],
        )
        checkpoints = db.query(
            "SELECT revision, epoch, owner = %s AS by_holder, transition, state_json, state_hash,"
            " schema_version FROM agent_checkpoints WHERE run_id = %s ORDER BY revision",
            [self.lease.owner, self.run],
        )
        outbox = db.query(
            "SELECT o.event_type, o.payload, c.revision"
            " FROM outbox o JOIN agent_checkpoints c USING (event_id)"
            " WHERE o.run_id = %s ORDER BY o.id",
            [self.run],
        )
        ledger = db.query(
            "SELECT status, revision, dispatch_owner, remote_id, result,"
            " jsonb_array_length(evidence) AS evidence FROM tool_operations WHERE run_id = %s",
            [self.run],
        )
        return {"run": run, "checkpoints": checkpoints, "outbox": outbox, "ledger": ledger}


def _checkpoints(c: Case) -> None:
    c.write(cp(c.lease, 0, {"a": [1, 2, {"é": None}]}, current_step="s1"))
    c.write(cp(c.lease, 1, {"b": 1}, schema_version=1))
    c.write(cp(c.lease, 1, {"again": True}))  # revision CAS
    c.write(cp(c.lease, 7))


def _start_and_terminals(transition: str) -> Callable[[Case], None]:
    def steps(c: Case) -> None:
        c.write(cp(c.lease, 0, transition="start", current_step="first"))
        c.write(cp(c.lease, 1, transition=transition, payload={"reason": f"why-{transition}"}))
        c.write(cp(c.lease, 2))  # the lease is given up: no write right any more

    return steps


def _stale_holders(c: Case) -> None:
    lease = c.lease
    c.write(cp(Lease(c.run, "someone-else", lease.epoch), 0))
    c.write(cp(Lease(c.run, lease.owner, lease.epoch - 1), 0))
    c.write(cp(Lease(c.run, lease.owner, lease.epoch + 1), 0))
    c.write(cp(Lease(uuid.uuid4(), lease.owner, lease.epoch), 0))
    c.write(cp(lease, 0))


def _intent_result(c: Case) -> None:
    c.intent(0)
    c.intent(1)  # the same intent again: accepted, one ledger row
    c.intent(2, {"order_id": "o1", "amount": 999})  # a different one: refused
    claim = c.claim()
    result = {"mode": "record", "outcome": "succeeded", "remote_id": "r-1", "result": {"x": 1}}
    c.write(cp(c.lease, 2, transition="tool_result", effect={**claim, "ledger_revision": 0}))
    c.write(cp(c.lease, 2, transition="tool_result", effect={**claim, **result}))
    c.write(cp(c.lease, 3, transition="tool_result", effect={**claim, **result}))


def _freeze(c: Case) -> None:
    c.intent(0)
    claim = c.claim()
    effect = {**claim, "error": {"class": "Timeout"}}
    c.write(cp(c.lease, 1, transition="freeze", effect=effect, payload={"reason": "in doubt"}))
    c.write(cp(c.lease, 2))


def _requeue(c: Case) -> None:
    c.write(cp(c.lease, 0, transition="requeue", effect={"backoff_ms": 60_000}, payload={}))
    c.write(cp(c.lease, 1))


SCENARIOS: dict[str, tuple[Callable[[Case], None], dict[str, Any]]] = {
    "checkpoints": (_checkpoints, {}),
    "succeed": (_start_and_terminals("succeed"), {}),
    "fail": (_start_and_terminals("fail"), {}),
    "pause_human": (_start_and_terminals("pause_human"), {}),
    "stale_holders": (_stale_holders, {}),
    "intent_result": (_intent_result, {}),
    "freeze": (_freeze, {}),
    "requeue": (_requeue, {}),
    "requeue_exhausted": (_requeue, {"max_attempts": 1}),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_both_shapes_same_answers_and_rows(rt: Runtime, ref_db: Database, name: str) -> None:
    steps, kwargs = SCENARIOS[name]
    seen: dict[str, tuple[list[tuple[Any, ...]], dict[str, Any]]] = {}
    for shape in SHAPES:
        case = Case(rt, shape, **kwargs)
        steps(case)
        seen[shape] = (case.answers, case.rows(ref_db))
    assert seen["fast"] == seen["stepped"]
    answers, rows = seen["fast"]
    assert any(a[0] == "ok" for a in answers) and any(a[0] != "ok" for a in answers), answers
    assert len(rows["checkpoints"]) == len(rows["outbox"]) == rows["run"][0]["revision"]


@pytest.mark.parametrize("expected_revision", [0, 5], ids=["revision_right", "revision_wrong"])
def test_expired_lease_same_rejection(
    rt: Runtime, ref_db: Database, expected_revision: int
) -> None:
    """Expiry is judged before the revision, in both shapes: the fast
    checkpoint's UPDATE matches (right revision) and is undone by FC002, or
    matches nothing (wrong revision) and the lock-first code names FC002."""
    answers = []
    for shape in SHAPES:
        case = Case(rt, shape, ttl_ms=100)
        time.sleep(0.15)
        case.write(cp(case.lease, expected_revision))
        answers.append(case.answers)
        rows = case.rows(ref_db)
        assert rows["checkpoints"] == [] and rows["run"][0]["revision"] == 0
    assert answers[0] == answers[1] == [("LeaseLost", "expired")]


def test_lease_expiring_while_waiting_for_the_row_lock_is_refused(
    rt: Runtime, ref_db: Database
) -> None:
    """The expiry is read after the lock even when the holder changed nothing
    (PostgreSQL re-checks a WHERE only against a changed row): a lease valid
    when the write was sent but expired when the lock came is refused."""
    ttl_s = 0.3
    for shape in SHAPES:
        case = Case(rt, shape, ttl_ms=int(ttl_s * 1000))
        # Read after the takeover committed, so no earlier than the lease's
        # start by the database's clock: leased_by + ttl_s is past its expiry.
        leased_by = time.monotonic()
        pid = rt.conn.info.backend_pid  # the connection case.writer writes on
        holder = psycopg.connect(ref_db.admin_dsn, autocommit=True)
        try:
            holder.execute("BEGIN")
            holder.execute("SELECT 1 FROM agent_runs WHERE run_id = %s FOR UPDATE", [case.run])
            t = threading.Thread(target=case.write, args=(cp(case.lease, 0),))
            t.start()
            wait_until_blocked_on_lock(ref_db, pid)
            assert not case.answers, f"{shape}: the write did not wait for the row lock"
            # Not a wait for the write: the lease must expire (by database
            # time) while the write waits, so sleep out the rest of its TTL,
            # with a margin, before the holder lets go.
            time.sleep(max(0.0, leased_by + ttl_s + 0.15 - time.monotonic()))
            expired = ref_db.query(
                "SELECT lease_expires_at <= clock_timestamp() AS expired"
                " FROM agent_runs WHERE run_id = %s",
                [case.run],
            )
            assert expired == [{"expired": True}], f"{shape}: the lease has not expired yet"
            assert not case.answers, f"{shape}: the write did not wait for the row lock"
            holder.execute("COMMIT")
            t.join(5)
            assert not t.is_alive(), f"{shape}: the write did not finish after the lock"
        finally:
            holder.close()
        assert case.answers == [("LeaseLost", "expired")], shape
        assert case.rows(ref_db)["checkpoints"] == []


def test_other_tenant_same_rejection(make_rt: Callable[..., Runtime]) -> None:
    a, b = make_rt("A"), make_rt("B", tenant=OTHER_TENANT)
    lease = take(a, new_run(a)).lease
    for shape in SHAPES:
        writer = ProtectedWriter(b.session, b.protocol.queries, stepped=shape == "stepped")
        with pytest.raises(e.RunNotFound):
            writer.write(cp(lease, 0))
    assert a.runs.state(a.conn, lease.run_id)["revision"] == 0


def _sql_args(lease: Lease, transition: str, effect: dict[str, Any] | None) -> dict[str, Any]:
    w = cp(lease, 0, transition="checkpoint", effect=effect)
    return {**w.params(), "transition": transition}


@pytest.mark.parametrize(
    ("transition", "effect"),
    [("bogus", None), ("requeue", {"backoff_ms": 86_400_001})],
)
def test_invalid_arguments_same_sqlstate(
    rt: Runtime, transition: str, effect: dict[str, Any] | None
) -> None:
    """What Write refuses in Python (unknown transition) the database refuses too."""
    q = rt.protocol.queries
    lease = take(rt, new_run(rt)).lease
    states = []
    for name in ("protected_write_fast", "protected_write"):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            rt.conn.execute(q.sql(name), _sql_args(lease, transition, effect))
        states.append(err.value.sqlstate)
    assert states == ["22023", "22023"]


def test_state_is_encoded_once_and_hashed_canonically(rt: Runtime, ref_db: Database) -> None:
    state = {"z": 1, "a": {"y": [1.5, "é", None], "b": True}}
    lease = take(rt, new_run(rt)).lease
    w = cp(lease, 0, state)
    params = w.params()
    assert params["state_hash"] == state_hash(state)
    assert params["state"].dumps(params["state"].obj) == canonical_json(state)
    rt.writer.write(w)
    row = ref_db.query(
        "SELECT state_json, state_hash FROM agent_checkpoints WHERE run_id = %s", [lease.run_id]
    )[0]
    assert row["state_json"] == state and bytes(row["state_hash"]) == state_hash(state)


# ------------------------------------------------------------------ the row lock


def test_fast_write_waits_for_the_row_lock_then_validates(
    make_rt: Callable[..., Runtime], ref_db: Database
) -> None:
    """Experiment D on the fast path: the checks read the row after the lock.

    B holds the lease row (a takeover in progress, not committed). A's write
    with the old lease waits for it, then sees B's epoch and is refused.
    """
    a, b = make_rt("A"), make_rt("B")
    run = new_run(a)
    lease = take(a, run, ttl_ms=200).lease
    assert not a.writer.stepped
    time.sleep(0.25)  # A's lease expired; nobody took over yet
    b.conn.execute("BEGIN")
    grant = b.leases.takeover(b.conn, run, b.owner, 10_000)
    assert grant.acquired and grant.epoch == lease.epoch + 1
    lease_a = Lease(run, lease.owner, lease.epoch)
    outcome: list[BaseException | object] = []

    def write() -> None:
        try:
            outcome.append(a.writer.write(cp(lease_a, 0)))
        except BaseException as exc:
            outcome.append(exc)

    a_pid = a.conn.info.backend_pid  # A's session connection, opened here, not in the thread
    t = threading.Thread(target=write)
    t.start()
    wait_until_blocked_on_lock(ref_db, a_pid)
    assert not outcome, "the fast write did not wait for the row lock"
    b.conn.execute("COMMIT")
    t.join(5)
    assert not t.is_alive(), "the fast write did not finish after the lock holder committed"
    assert len(outcome) == 1 and isinstance(outcome[0], e.LeaseLost)
    assert outcome[0].reason == "lost"
    st = a.runs.state(a.conn, run)
    assert (st["epoch"], st["owner"], st["revision"]) == (lease.epoch + 1, b.owner, 0)


def test_fast_write_reports_its_lock_wait(
    make_rt: Callable[..., Runtime], ref_db: Database
) -> None:
    a, b = make_rt("A"), make_rt("B")
    run = new_run(a)
    lease = take(a, run).lease
    b.conn.execute("BEGIN")
    b.conn.execute(
        b.protocol.queries.sql("lock_lease"),
        {"run_id": run, "owner": lease.owner, "epoch": lease.epoch},
    )
    done: list[Any] = []
    a_pid = a.conn.info.backend_pid  # A's session connection, opened here, not in the thread
    t = threading.Thread(target=lambda: done.append(a.writer.write(cp(lease, 0))))
    t.start()
    wait_until_blocked_on_lock(ref_db, a_pid)
    assert not done, "the fast write did not wait for the row lock"
    # The write is waiting now: hold the lock 200 ms more, so that it waited
    # at least that long and lock_wait_ms >= 150 is a real measurement.
    time.sleep(0.2)
    assert not done, "the fast write did not wait for the row lock"
    b.conn.execute("COMMIT")
    t.join(5)
    assert not t.is_alive(), "the fast write did not finish after the lock holder committed"
    assert done and done[0].revision == 1
    assert done[0].lock_wait_ms is not None and done[0].lock_wait_ms >= 150


# ------------------------------------------------------------------ no bypass


def test_fast_function_is_closed_like_the_rest_of_the_api(ref_db: Database) -> None:
    row = ref_db.query(
        "SELECT p.prosecdef, pg_get_userbyid(p.proowner) AS owner, p.proconfig,"
        " has_function_privilege('fencecheck_worker', p.oid, 'EXECUTE') AS worker,"
        " has_function_privilege('public', p.oid, 'EXECUTE') AS everyone"
        " FROM pg_proc p WHERE p.oid = 'fencecheck.protected_write_fast'::regproc"
    )[0]
    assert row["prosecdef"] and row["owner"] == "fencecheck_owner"
    assert row["proconfig"] == ["search_path=pg_catalog, pg_temp"]
    assert row["worker"] and not row["everyone"]
    # 006's function, renamed by 007: the fallback, not a way around the fast path.
    helper = ref_db.query(
        "SELECT pg_get_userbyid(p.proowner) AS owner,"
        " has_function_privilege('fencecheck_worker', p.oid, 'EXECUTE') AS worker,"
        " has_function_privilege('public', p.oid, 'EXECUTE') AS everyone"
        " FROM pg_proc p WHERE p.oid = 'fencecheck._protected_write_lock_first'::regproc"
    )[0]
    assert helper == {"owner": "fencecheck_owner", "worker": False, "everyone": False}


def test_fast_statement_is_prepared_again_on_a_new_connection(rt: Runtime) -> None:
    lease = take(rt, new_run(rt)).lease
    assert rt.writer.write(cp(lease, 0)).revision == 1
    first = rt.conn
    assert isinstance(first, db.Connection) and len(first.prepared) == 1
    rt.session.discard()
    assert rt.writer.write(cp(lease, 1)).revision == 2
    assert rt.conn is not first and rt.conn.prepared == first.prepared  # type: ignore[attr-defined]


def test_terminated_backend_is_outcome_unknown_then_read_back(
    rt: Runtime, ref_db: Database
) -> None:
    """The connection dies under the fast write: no server verdict, so the
    write is read back by its event_id (nothing committed) and retried with
    the same event on a new connection: exactly one checkpoint and one event."""
    run = new_run(rt)
    lease = take(rt, run).lease
    pid = rt.conn.info.backend_pid
    ref_db.query("SELECT pg_terminate_backend(%s, 5000)", [pid])
    w = cp(lease, 0)
    out = rt.writer.write(w)
    assert (out.revision, out.event_id, out.read_back) == (1, w.event_id, False)
    rows = ref_db.query(
        "SELECT (SELECT count(*) FROM agent_checkpoints WHERE run_id = %(r)s) AS checkpoints,"
        " (SELECT count(*) FROM outbox WHERE run_id = %(r)s) AS events",
        {"r": run},
    )[0]
    assert (rows["checkpoints"], rows["events"]) == (1, 1)
    assert rt.conn.info.backend_pid != pid


def test_fast_write_waiting_for_a_lock_is_interruptible(rt: Runtime, ref_db: Database) -> None:
    """Ctrl-C reaches a fast write blocked on the row lock (psycopg's wait
    wakes every 0.1 s), cancels it on the server, and nothing is written."""
    lease = take(rt, new_run(rt)).lease
    pid = rt.conn.info.backend_pid  # the connection rt.writer writes on
    main_thread = threading.get_ident()
    holder = psycopg.connect(ref_db.admin_dsn, autocommit=True)
    armed = threading.Event()  # outside the write, a late signal interrupts nothing
    not_blocked: list[BaseException] = []

    def interrupt(signum: int, frame: object) -> None:
        if armed.is_set():
            raise KeyboardInterrupt

    def interrupt_once_blocked() -> None:
        """The Ctrl-C, sent once the server shows the write waiting on the lock."""
        try:
            wait_until_blocked_on_lock(ref_db, pid, timeout_s=20.0)
        except WaitTimeout as exc:
            not_blocked.append(exc)
        else:
            signal.pthread_kill(main_thread, signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, interrupt)
    # The holder lets go after 30 s in any case: a write that cannot be
    # interrupted then finishes late instead of hanging the test. Whether
    # the interrupt waited for it is an order, not a stopwatch: it came
    # before the holder let go.
    letting_go = threading.Event()

    def let_go() -> None:
        letting_go.set()
        holder.execute("COMMIT")

    release = threading.Timer(30.0, let_go)
    interrupter = threading.Thread(target=interrupt_once_blocked)
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM agent_runs WHERE run_id = %s FOR UPDATE", [lease.run_id])
        release.start()
        armed.set()
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            rt.writer.write(cp(lease, 0))
        assert not letting_go.is_set(), "the interrupt waited for the lock holder"
    finally:
        armed.clear()
        if interrupter.ident is not None:
            interrupter.join(5)
        signal.signal(signal.SIGALRM, previous)
        release.cancel()
        release.join(5)
        if holder.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            holder.execute("COMMIT")
        holder.close()
        if not_blocked:  # why no interrupt came, rather than only that none did
            raise not_blocked[0]
    assert rt.runs.state(rt.conn, lease.run_id)["revision"] == 0
    assert rt.writer.write(cp(lease, 0)).revision == 1  # the session is usable again


def test_libpq_statement_raises_as_the_cursor_path(rt: Runtime, ref_db: Database) -> None:
    conn = rt.conn
    assert isinstance(conn, db.Connection)
    stmt = db.LibpqStatement.from_named("SELECT 1 / %(n)s AS q, %(n)s + 0 AS n")
    assert stmt.names == ("n",) and b"$1" in stmt.text and b"%(" not in stmt.text
    assert stmt.run(conn, {"n": 1}) == ("1", "1")
    with pytest.raises(psycopg.errors.DivisionByZero) as err:
        stmt.run(conn, {"n": 0})
    assert err.value.sqlstate == "22012"
    assert not conn.broken  # a server error leaves the connection usable
    ref_db.query("SELECT pg_terminate_backend(%s, 5000)", [conn.info.backend_pid])
    with pytest.raises(psycopg.OperationalError) as lost:
        stmt.run(conn, {"n": 1})
    assert outcome_unknown(lost.value)


def test_libpq_statement_text_forms() -> None:
    class Level(int):
        pass

    u = uuid.UUID(int=7)
    assert db.LibpqStatement.from_named("SELECT %(a)s, %(b)s, %(a)s").text == b"SELECT $1, $2, $1"
    forms = {
        "none": (None, None),
        "bool": (True, b"t"),
        "int": (-3, b"-3"),
        "subclass": (Level(4), b"4"),
        "float": (0.5, b"0.5"),
        "uuid": (u, str(u).encode()),
        "bytes": (b"\x01\xff", b"\\x01ff"),
        "json": (Jsonb({"b": 1, "a": [True]}), b'{"a":[true],"b":1}'),
        "json text": (Jsonb('{"x":1}', dumps=lambda t: t), b'{"x":1}'),
    }
    stmt = db.LibpqStatement.from_named(" ".join(f"%({k.replace(' ', '_')})s" for k in forms))
    assert len(stmt.names) == len(forms)
    for name, (value, text) in forms.items():
        assert db._as_text(value) == text, name
    with pytest.raises(TypeError, match="no text form"):
        db._as_text(object())


def test_hot_statements_keep_one_prepared_cursor_per_connection(rt: Runtime) -> None:
    q = rt.protocol.queries.sql("run_state")
    conn = rt.conn
    assert isinstance(conn, db.Connection)
    run = new_run(rt)
    first = db.execute(conn, q, {"run_id": run}, dict_row)
    assert first.fetchone()["run_id"] == run  # type: ignore[index]
    again = db.execute(conn, q, {"run_id": run}, dict_row)
    assert again is first
    plain = psycopg.connect(conn.info.dsn, autocommit=True)
    try:
        other = db.execute(plain, q, {"run_id": run}, dict_row)  # type: ignore[arg-type]
        assert other is not first and other.fetchone()["run_id"] == run  # type: ignore[index]
    finally:
        plain.close()

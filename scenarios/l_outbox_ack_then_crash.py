"""L: the outbox is delivered at least once and each event's business effect
happens once, whatever the relay and the broker do in between.

Three checkpoints leave three outbox events. A relay publishes them and a
consumer applies them; one variant per thing that goes wrong on the way:

* ``ack_then_crash``: the relay dies (SIGKILL at
  after_broker_ack_before_outbox_mark) after the broker acknowledged the first
  message, before marking it: the next relay publishes it again.
* ``publish_fails``: the broker refuses the second publish of the relay's
  locked batch (503, nothing taken): that row is not marked, a later relay
  publishes it.
* ``publish_nacked``: the same with a negative acknowledgement: the broker
  answers the second publish 200 with ``ack: false`` (a publisher confirm's
  nack, nothing taken), which is no acknowledgement either (blind hunt 71
  #05: a Go relay took any 200 for one and marked the row published).
* ``late_ack``: the broker takes the first publish only after the relay's own
  timeout: no ack, so no mark; the next relay publishes it again.
* ``duplicate_delivery``: the broker hands one message out twice in one read.
* ``reordered_delivery``: the broker hands one read out in reverse order.
  Before that, the run's rows are stored out of id order: a filler run's
  three events are written first and published, the database is vacuumed so
  their old row versions' space is free, and the run's later two events take
  that space, ahead of its first event. The limit-1 cycle must still publish
  the oldest row (blind hunt 39 #06: a batch without ``ORDER BY id`` read the
  table in its stored order).
* ``concurrent_relays``: a relay holds its locked batch (held at
  after_outbox_batch_locked, nothing published) while a second relay runs a
  cycle: the second must neither publish nor mark a row of that batch (it
  skips the locked rows, or waits for them); the broker holds no message of
  the batch until the first relay goes on.
* ``late_commit``: a row whose id was taken before another's but whose
  transaction commits later (its writer held at before_commit while a second
  writer commits, so the ids commit out of order) commits after a relay locked
  its batch, inside that batch's id range, before the relay marks it: the
  batch's rows are marked and that one is not, since the broker never had it
  (blind hunt 62 #03: a mark by the batch's id range, "a batch locked in id
  order is contiguous", marked it published unpublished); the next cycle
  publishes it.
* ``apply_fails``: the consumer's database link is cut after it read the
  batch and before it applied any of it (held at after_consumer_read): that
  pass fails, the consumer process lives on, and its next passes over the
  healed link must apply every event of the batch (a consumer that moved its
  read position past what it never applied loses them for good).

In every variant the consumer is judged on every event the broker holds
(its own delivery log, not only the repeated one): each handed out and
applied exactly once; and no outbox row is marked published before the
broker had its message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec, plain
from harness.parts.control import Crash, Hold
from harness.parts.processes import OpReply, WorkerProcess
from scenarios.common import new_run, seen_within

EVENTS = 3
LATE_COMMIT = "late_commit"
CONSUMER = "billing"
# A second consumer of the same events, after the first (its own dedup rows).
# duplicate_delivery, reordered_delivery: the events of a later run, published
# after the consumer's first passes, that its next pass must apply.
LATER_EVENTS = 2
SECOND_CONSUMER = "audit"
THIRD_CONSUMER = "ledger-sync"
# The relay's own call timeout in late_ack (FENCECHECK_TOOL_TIMEOUT_MS), and
# how long the broker holds that publish before it takes it: well past it.
RELAY_TIMEOUT_MS = 300
LATE_ACK_MS = 900

SPEC = ExperimentSpec(
    id="L",
    title="outbox ack then crash",
    seed_section="Chinese seed §11, §13.2 (Outbox ACK 后崩溃); English seed §12",
    invariant="at-least-once: a row is marked published only after the broker has its message, "
    "a refused or unanswered publish is published again; every event the broker holds is "
    "handed to the consumer and its business effect happens exactly once, and once more for a "
    "second consumer name",
    fault="one per variant: the relay SIGKILLed between the broker's ack and the mark; the "
    "broker refuses one publish of a batch, acks after the relay's timeout, hands a message "
    "out twice, hands a read out of order; the consumer's database link cut between its read "
    "and its first apply",
    rules=(10,),
    injection_point="after_broker_ack_before_outbox_mark",
    needs=(
        *needs.capabilities("outbox", "consumer_dedupe"),
        needs.point("after_broker_ack_before_outbox_mark", "ack_then_crash"),
        needs.point("after_consumer_read", "apply_fails"),
        needs.point("after_consumer_dedup_commit", "reordered_delivery"),
        needs.point("after_outbox_batch_locked", "concurrent_relays", LATE_COMMIT),
        needs.point("before_commit", LATE_COMMIT),
    ),
    variants=(
        "ack_then_crash",
        "publish_fails",
        "publish_nacked",
        "late_ack",
        "duplicate_delivery",
        "reordered_delivery",
        "concurrent_relays",
        "apply_fails",
        LATE_COMMIT,
    ),
    # The late row's writer is held before its COMMIT, a point of the stepped path.
    variant_write_paths=((LATE_COMMIT, "stepped"),),
    variant_points=(
        ("publish_fails", "none (broker fault)"),
        ("publish_nacked", "none (broker fault)"),
        ("late_ack", "none (broker fault)"),
        ("duplicate_delivery", "none (broker fault)"),
        ("reordered_delivery", "after_consumer_dedup_commit"),
        ("concurrent_relays", "after_outbox_batch_locked"),
        ("apply_fails", "after_consumer_read"),
        (LATE_COMMIT, "before_commit, after_outbox_batch_locked"),
    ),
    variant_faults=(
        ("ack_then_crash", "SIGKILL at after_broker_ack_before_outbox_mark"),
        ("publish_fails", "the broker refuses the second publish of the relay's locked batch"),
        (
            "publish_nacked",
            "the broker answers the second publish of the relay's locked batch with a nack "
            "(200, ack false, nothing taken)",
        ),
        (
            "late_ack",
            f"the broker takes the first publish {LATE_ACK_MS} ms late, after the "
            f"relay's {RELAY_TIMEOUT_MS} ms timeout",
        ),
        ("duplicate_delivery", "the broker hands the first message of a read out twice"),
        (
            "reordered_delivery",
            "the run's outbox rows stored out of id order (a filler's rows published, the "
            "database vacuumed, later rows in the freed space); the broker hands a read out in "
            "reverse order (twice: the second time a third consumer's database link is cut "
            "after its first apply)",
        ),
        (
            "concurrent_relays",
            "a second relay's cycle while the first holds its locked batch, nothing published",
        ),
        (
            "apply_fails",
            "the consumer's database link cut while it holds a read batch, none of it applied",
        ),
        (
            LATE_COMMIT,
            "an outbox row whose id was taken first commits after a higher one, and after a "
            "relay locked a batch whose id range holds it, before that relay marks its batch",
        ),
    ),
    variant_waits=(("late_ack", LATE_ACK_MS / 1000),),
)


def run(ctx: ExperimentContext) -> None:
    variant = VARIANTS[ctx.variant or "ack_then_crash"]
    run_id, events = _outbox_events(ctx, out_of_id_order=variant.out_of_id_order)
    variant.publish(ctx, run_id, events)
    consumer = variant.consume(ctx) if variant.consume else ctx.env.start_worker("K", "ops")
    ctx.ok(consumer, "consume", consumer=CONSUMER)
    again = ctx.ok(consumer, "consume", consumer=CONSUMER)  # a second pass sees nothing new
    variant.confirm(ctx, events)
    if ctx.variant in ("duplicate_delivery", "reordered_delivery"):
        # Every message was at the broker before the first pass read them all,
        # out of order or one twice: the position the consumer keeps is past
        # the highest it read (blind hunt 50 #05: the Go consumer kept the
        # last one's, so the next pass read the batch again as duplicates).
        ctx.invariant(
            "a consumer's next pass reads only messages it has not seen",
            (again.get("consumed"), again.get("duplicates")) in ((0, 0), (None, None)),
            expected="the second pass: consumed 0, duplicates 0 (nothing new at the broker)",
            observed=f"the second pass answered {again}",
        )
        _later_pass_applies_what_came_since(ctx, consumer)
    checkers.every_event_applied_once(ctx, CONSUMER)
    _another_consumer_applies_them_too(ctx, consumer)
    outbox = checkers.outbox(ctx, run_id)
    ctx.progress(
        "every outbox row finally marked",
        len(outbox) == EVENTS and all(r["published_at"] is not None for r in outbox),
        expected=f"{EVENTS} rows, each published_at set by a relay",
        observed=f"{[(str(r['event_id'])[:8], r['published_at']) for r in outbox]}",
    )
    _nothing_marked_before_the_broker(ctx, run_id, "in the end")
    _published_stays_published(ctx, run_id)
    if ctx.variant == "reordered_delivery":
        _cut_after_an_out_of_order_apply(ctx)


def _later_pass_applies_what_came_since(ctx: ExperimentContext, consumer: WorkerProcess) -> None:
    """More events reach the broker after the consumer's passes; the same
    process's next pass applies each of them (blind hunt 54 #07: a Go consumer
    that kept the first sequence number it had not read as its position, and
    read after it, passed over the first message published after every pass)."""
    later, w = _run_with_checkpoints(ctx, "L2", LATER_EVENTS, "later")
    ctx.ok(w, "relay")
    events = [str(r["event_id"]) for r in checkers.outbox(ctx, later)]
    ctx.ok(consumer, "consume", consumer=CONSUMER)
    effects = checkers.consumer_effects(ctx, CONSUMER)
    wrong = [f"{e[:8]}: {effects.get(e, 0)} effects" for e in events if effects.get(e) != 1]
    ctx.invariant(
        "a consumer's later pass applies every event published since its last",
        bool(events) and not wrong,
        expected=f"each of the {LATER_EVENTS} events of a later run, relayed after the "
        f"consumer's passes, applied once by {CONSUMER}'s next pass in the same process",
        observed="; ".join(wrong) or f"{len(events)} event(s), each applied once",
    )


def _another_consumer_applies_them_too(ctx: ExperimentContext, consumer: WorkerProcess) -> None:
    """Deduplication is per consumer: a second consumer name reading the same
    events applies each once of its own (contract section 6: consumed_events
    is keyed by consumer_name and event_id; blind bug hunt round 25, #08: a
    key of event_id alone turned every event away from the second consumer as
    a duplicate). Judged on what the broker handed that pass (its delivery
    log): an event handed to an ok pass and not applied is lost for that
    consumer, whose position has moved past it."""
    reads_before = len(checkers.tool_log(ctx).get("deliveries", []))
    ctx.ok(consumer, "consume", consumer=SECOND_CONSUMER)
    reads = checkers.tool_log(ctx).get("deliveries", [])[reads_before:]
    handed = {str(e) for d in reads for e in d.get("event_ids", [])}
    effects = checkers.consumer_effects(ctx, SECOND_CONSUMER)
    wrong = sorted(f"{e[:8]}: {effects.get(e, 0)} effects" for e in handed if effects.get(e) != 1)
    ctx.invariant(
        "a second consumer applies every event it is handed once of its own",
        bool(handed) and not wrong,
        expected=f"each event the broker handed {SECOND_CONSUMER}'s pass applied once by "
        f"{SECOND_CONSUMER}, whatever {CONSUMER} applied before",
        observed="; ".join(wrong) or f"{len(handed)} event(s) handed, each applied once",
    )


def _published_stays_published(ctx: ExperimentContext, run_id: str) -> None:
    """One more relay cycle once every row is marked: a row marked published is
    never handed to the broker again (blind hunt 14 #02: a batch lock without
    ``published_at IS NULL`` republished every row at every cycle)."""
    marked = {str(r["event_id"]) for r in checkers.outbox(ctx, run_id) if r["published_at"]}
    name = "a relay cycle publishes no row already marked published"
    if len(marked) < EVENTS:
        ctx.not_judged(
            name,
            expected=f"judged once all {EVENTS} rows are marked",
            observed=f"{len(marked)} marked",
        )
        return

    def copies() -> int:
        return sum(1 for m in checkers.tool_log(ctx)["messages"] if str(m["event_id"]) in marked)

    before = copies()
    reply = ctx.op(ctx.env.start_worker("R9", "ops"), "relay")
    after = copies()
    ctx.invariant(
        name,
        after == before,
        expected=f"the broker's copies of the {EVENTS} marked rows unchanged by one more relay "
        "cycle",
        observed=f"copies {before} before, {after} after (the cycle answered "
        f"{reply.result if reply.ok else reply.error})",
    )


# The writers of L's events hold their leases past the whole set-up: L tests the
# relay and the consumers, and a write refused for a lease that ran out beside a
# VACUUM on a busy machine tested nothing (seen beside six hogs).
SETUP_LEASE: dict[str, str | None] = {"FENCECHECK_LEASE_TTL_MS": "30000"}


def _outbox_events(
    ctx: ExperimentContext, *, out_of_id_order: bool = False
) -> tuple[str, list[str]]:
    """A run with ``EVENTS`` checkpoints, hence as many outbox events, unpublished.
    With ``out_of_id_order`` the rows are stored out of id order: a filler
    run's events come first and are published, a VACUUM frees their old row
    versions' space, and the run's events after its first take that space."""
    run_id = new_run(ctx)
    w = ctx.env.start_worker("W", "ops", env=SETUP_LEASE)
    if out_of_id_order:
        _filler_events(ctx)
    lease = ctx.ok(w, "claim", run_id=run_id)
    rev, events = lease["revision"], []
    for i in range(EVENTS):
        if out_of_id_order and i == 1:
            _filler_published_and_vacuumed(ctx)
        saved = ctx.ok(
            w,
            "save_checkpoint",
            run_id=run_id,
            epoch=lease["epoch"],
            expected_revision=rev,
            state={"step": f"notify {i + 1}"},
        )
        rev = saved["revision"]
        events.append(str(saved["event_id"]))
    if out_of_id_order:
        stored = _pending_in_stored_order(ctx)
        ctx.fault(
            "the run's unpublished rows are stored out of id order",
            stored != sorted(stored) and stored[-1:] == [min(stored, default=0)],
            expected="a sequential scan of the tenant's unpublished rows meets the run's first "
            "event last",
            observed=f"outbox ids of the unpublished rows in stored order: {stored}",
        )
    return run_id, events


def _filler_events(ctx: ExperimentContext) -> None:
    """A filler run's ``EVENTS`` checkpoints: outbox rows older than the run's."""
    _run_with_checkpoints(ctx, "F", EVENTS, "filler")


def _run_with_checkpoints(
    ctx: ExperimentContext, worker: str, count: int, label: str
) -> tuple[str, WorkerProcess]:
    """A new run with ``count`` checkpoints written by ops process ``worker``
    (one outbox event each); the run and the process."""
    run_id = new_run(ctx)
    w = ctx.env.start_worker(worker, "ops", env=SETUP_LEASE)
    lease = ctx.ok(w, "claim", run_id=run_id)
    rev = lease["revision"]
    for i in range(count):
        rev = ctx.ok(
            w, "save_checkpoint", run_id=run_id, epoch=lease["epoch"], expected_revision=rev,
            state={"step": f"{label} {i + 1}"},
        )["revision"]  # fmt: skip
    return run_id, w


def _filler_published_and_vacuumed(ctx: ExperimentContext) -> None:
    """Publish the filler's rows (the oldest ``EVENTS``), then VACUUM the
    experiment's database: their old row versions' space is free again, so the
    next rows written take it, stored ahead of the run's first row."""
    ctx.ok(ctx.env.start_worker("R0", "ops"), "relay", limit=EVENTS)
    ctx.env.query("VACUUM")
    ctx.command("VACUUM the experiment's database (the filler rows' old versions freed)")


def _pending_in_stored_order(ctx: ExperimentContext) -> list[int]:
    """The tenant's unpublished outbox ids as a sequential scan meets them (the
    table's stored order; no index may answer)."""
    with psycopg.connect(
        ctx.env.db.admin_dsn, connect_timeout=5, application_name="fencecheck-harness-probe"
    ) as conn:
        for setting in ("enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan"):
            conn.execute(f"SET LOCAL {setting} = off")
        rows = conn.execute(
            "SELECT id FROM fencecheck_model.outbox WHERE published_at IS NULL AND tenant_id = %s",
            [ctx.env.tenant_id],
        ).fetchall()
        conn.rollback()
    return [int(r[0]) for r in rows]


def _nothing_marked_before_the_broker(ctx: ExperimentContext, run_id: str, when: str) -> None:
    """No outbox row of the run is marked published before the broker took a
    message with its event_id (the broker's own log, its ``received_at``)."""
    first: dict[str, float] = {}
    for m in checkers.tool_log(ctx)["messages"]:
        first.setdefault(str(m["event_id"]), float(m["received_at"]))
    early = [
        f"{str(r['event_id'])[:8]} marked at {r['published_at'].isoformat()}, broker "
        + (
            f"took it at {first[str(r['event_id'])]:.3f}"
            if str(r["event_id"]) in first
            else "never"
        )
        for r in checkers.outbox(ctx, run_id)
        if r["published_at"] is not None
        and r["published_at"].timestamp() < first.get(str(r["event_id"]), float("inf"))
    ]
    ctx.invariant(
        f"nothing marked before the broker had it ({when})",
        not early,
        expected="each row marked published only after the broker took its message",
        observed="; ".join(early) or "every mark follows the broker's copy",
    )


# ------------------------------------------------------------------ variants


def _ack_then_crash(ctx: ExperimentContext, run_id: str, events: list[str]) -> None:
    ctx.arm("R1", "after_broker_ack_before_outbox_mark", Crash())
    r1 = ctx.env.start_worker("R1", "ops")
    ctx.op_async(r1, "relay", {})
    code = r1.wait(15)
    ctx.command(f"R1 exited with code {code}")
    acked = _copies(ctx, events[0])
    pending = [e for e in checkers.outbox(ctx, run_id) if str(e["event_id"]) == events[0]]
    ctx.fault(
        "the broker acknowledged, then the relay died before marking",
        code == -9 and len(acked) == 1 and bool(pending) and pending[0]["published_at"] is None,
        expected="R1 killed; broker holds the first message once; its outbox row unpublished",
        observed=f"R1 exit {code}; broker copies {len(acked)}; outbox published_at "
        f"{pending[0]['published_at'] if pending else 'no row'}",
    )
    ctx.ok(ctx.env.start_worker("R2", "ops"), "relay")


def _publish_fails(ctx: ExperimentContext, run_id: str, events: list[str]) -> None:
    _publish_refused(ctx, run_id, events, "publish_fail")


def _publish_nacked(ctx: ExperimentContext, run_id: str, events: list[str]) -> None:
    _publish_refused(ctx, run_id, events, "publish_nack")


def _publish_refused(ctx: ExperimentContext, run_id: str, events: list[str], mode: str) -> None:
    """The broker does not take the second publish of the relay's batch: a 503
    (``publish_fail``) or a 200 saying ``ack: false`` (``publish_nack``)."""
    ctx.env.tool.client().set_fault("broker", mode, skip=1)
    ctx.command(f"broker: the second publish from now on is refused ({mode}, skip 1)")
    before = [r for r in checkers.outbox(ctx, run_id) if r["published_at"] is None]
    reply = ctx.op(ctx.env.start_worker("R1", "ops"), "relay")
    refused = [str(r["event_id"]) for r in checkers.tool_log(ctx)["refused_publishes"]]
    ctx.fault(
        "the broker refused one publish of a locked batch",
        len(before) == EVENTS and len(refused) == 1 and refused[0] in events,
        expected=f"R1's batch held {EVENTS} unpublished rows; the broker refused its second "
        "publish, an event of the run, and nothing else",
        observed=f"{len(before)} unpublished before R1; refused {[e[:8] for e in refused]}",
    )
    rows = [r for r in checkers.outbox(ctx, run_id) if str(r["event_id"]) in refused[:1]]
    ctx.invariant(
        "the refused event stays pending",
        bool(rows) and rows[0]["published_at"] is None,
        expected="the refused event not marked published by the cycle the broker refused it in",
        observed=f"{refused[0][:8] if refused else 'no refusal'}: published_at "
        f"{rows[0]['published_at'] if rows else 'no row'}",
    )
    # One refused message stops neither the cycle nor what it did: a relay that
    # gave back every mark of its batch would meet the same refusal at the same
    # row each cycle and republish the rows before it forever (blind hunt 15
    # #09: a refusal returned out of the batch's transaction).
    taken = {str(m["event_id"]) for m in checkers.tool_log(ctx)["messages"]}
    unmarked = [
        str(r["event_id"])[:8]
        for r in checkers.outbox(ctx, run_id)
        if str(r["event_id"]) in taken and r["published_at"] is None
    ]
    # In outbox order, stopping at the refusal: no later row of the run may
    # reach the broker before an earlier one still pending (blind hunt 16
    # #04: a relay that went on past the refused row published out of order).
    ids = {str(r["event_id"]): int(r["id"]) for r in checkers.outbox(ctx, run_id)}
    refused_id = ids.get(refused[0]) if refused else None
    past = sorted(e[:8] for e in taken if refused_id is not None and ids.get(e, 0) > refused_id)
    ctx.invariant(
        "a relay cycle stops at a refused publish",
        not past,
        expected="no row after the refused one (by outbox id) taken by the broker in that cycle: "
        "a run's events reach the broker in outbox order",
        observed=f"taken after the refused row: {past or 'none'}",
    )
    ctx.invariant(
        "a refused publish keeps the cycle's other marks",
        reply.ok and not unmarked,
        expected="R1's cycle answers ok, every row whose message the broker took marked "
        "published, the refused one pending",
        observed=f"reply {reply.result if reply.ok else f'{reply.error}: {reply.message}'}; "
        f"taken by the broker but not marked: {unmarked}",
    )
    ctx.ok(ctx.env.start_worker("R2", "ops"), "relay")


def _late_ack(ctx: ExperimentContext, run_id: str, events: list[str]) -> None:
    ctx.env.tool.client().set_fault("broker", "publish_ack_late", ms=LATE_ACK_MS)
    ctx.command(f"broker: the next publish is taken and acknowledged {LATE_ACK_MS} ms late")
    r1 = ctx.env.start_worker(
        "R1", "ops", env={"FENCECHECK_TOOL_TIMEOUT_MS": str(RELAY_TIMEOUT_MS)}
    )
    ctx.op(r1, "relay")
    late = seen_within(
        lambda: [m for m in _copies(ctx, events[0]) if m.get("fault_mode") == "publish_ack_late"],
        what="the broker to take the late publish",
        timeout_s=LATE_ACK_MS / 1000 + 5,
    )
    held_ms = (late[0]["received_at"] - late[0]["arrived_at"]) * 1000 if late else 0.0
    ctx.fault(
        "the broker took the publish only after the relay's timeout",
        bool(late) and held_ms >= LATE_ACK_MS > RELAY_TIMEOUT_MS,
        expected=f"the first message taken {LATE_ACK_MS} ms after its publish arrived, R1's "
        f"timeout {RELAY_TIMEOUT_MS} ms",
        observed=f"taken {held_ms:.0f} ms after arrival" if late else "never taken",
    )
    _nothing_marked_before_the_broker(ctx, run_id, "after the late ack")
    ctx.ok(ctx.env.start_worker("R2", "ops"), "relay")


def _concurrent_relays(ctx: ExperimentContext, run_id: str, events: list[str]) -> None:
    """R1 locks the batch and is held there; R2 runs a cycle meanwhile. A row
    R1 holds is R1's to publish: the broker must get none of them before R1
    goes on, whether R2 skipped them or waited for R1's transaction."""
    ctx.arm("R1", "after_outbox_batch_locked", Hold())
    r1 = ctx.env.start_worker("R1", "ops")
    first = ctx.op_async(r1, "relay", {})
    ctx.reached("R1", "after_outbox_batch_locked")
    r2 = ctx.env.start_worker("R2", "ops")
    second = ctx.op_async(r2, "relay", {})
    answered = seen_within(lambda: second.done() or None, what="R2's relay cycle", timeout_s=3)
    waiting = False if answered else checkers.backend_waiting_on_lock(ctx, "R2", timeout_s=2)
    early = [m for m in checkers.tool_log(ctx)["messages"] if m["event_id"] in events]
    marked = [r for r in checkers.outbox(ctx, run_id) if r["published_at"] is not None]
    ctx.fault(
        "a second relay ran while the first held its locked batch",
        bool(answered) or waiting,
        expected="R1 held at after_outbox_batch_locked with the run's unpublished rows; R2's "
        "cycle answered, or waited on R1's locks, meanwhile",
        observed=f"R2 answered: {bool(answered)}; R2 waiting on a lock: {waiting}",
    )
    ctx.invariant(
        "no row of a batch another relay holds is published or marked",
        not early and not marked,
        expected=f"none of the run's {EVENTS} events at the broker, none marked, while R1 "
        "holds them",
        observed=f"at the broker: {[m['event_id'][:8] for m in early]}; marked: "
        f"{[str(r['event_id'])[:8] for r in marked]} (R2 answered: {bool(answered)})",
    )
    ctx.release("R1", "after_outbox_batch_locked")
    first.result(15)
    reply = second.result(15)
    # Rows another relay holds are no error: a relay that fails its cycle
    # whenever another one holds a batch (NOWAIT) publishes nothing while any
    # relay works, which the outbox cannot live with.
    ctx.progress(
        "a relay cycle beside another relay's held batch ends ok",
        reply.ok,
        expected="R2's relay answered ok (it skipped R1's rows or waited for them)",
        observed=f"R2's relay: {'ok ' + plain(reply.result) if reply.ok else reply.error}",
    )
    _lower_rows_given_back(ctx, r2)


def _late_commit_in_batch(ctx: ExperimentContext, run_id: str, events: list[str]) -> None:
    """WX's write takes its outbox id and is held before its COMMIT; WY's write
    takes the next id and commits; R1 locks its batch (the run's rows and
    WY's) and is held there; WX commits; R1 goes on. WX's row lies inside
    R1's batch's id range but was never in its batch: R1 must not mark it,
    and the next cycle publishes it."""
    late_run = new_run(ctx)
    wx = ctx.env.start_worker("WX", "ops", env=SETUP_LEASE)
    lease = ctx.ok(wx, "claim", run_id=late_run)
    ctx.arm("WX", "before_commit", Hold())
    pending = ctx.op_async(wx, "save_checkpoint", {
        "run_id": late_run, "epoch": lease["epoch"], "expected_revision": lease["revision"],
        "state": {"step": "committed late"},
    })  # fmt: skip
    ctx.reached("WX", "before_commit", held=True)
    first_run, _ = _run_with_checkpoints(ctx, "WY", 1, "committed first")
    ctx.arm("R1", "after_outbox_batch_locked", Hold())
    r1 = ctx.env.start_worker("R1", "ops")
    cycle = ctx.op_async(r1, "relay", {})
    ctx.reached("R1", "after_outbox_batch_locked")
    ctx.release("WX", "before_commit")
    late = pending.result(15)
    late_rows, first_rows = checkers.outbox(ctx, late_run), checkers.outbox(ctx, first_run)
    ctx.release("R1", "after_outbox_batch_locked")
    reply = cycle.result(15)
    at_broker = {str(m["event_id"]) for m in checkers.tool_log(ctx)["messages"]}
    late_ids = [int(r["id"]) for r in late_rows]
    first_ids = [int(r["id"]) for r in first_rows]
    ctx.fault(
        "a row committed inside a locked batch's id range, after the lock",
        late.ok
        and bool(late_ids)
        and bool(first_ids)
        and late_ids[0] < first_ids[0]
        and all(str(r["event_id"]) in at_broker for r in first_rows),
        expected="WX's write committed while R1 held its batch, its outbox id below WY's, "
        "which R1's cycle published",
        observed=f"WX {'ok' if late.ok else late.error}; outbox ids WX {late_ids}, WY "
        f"{first_ids}; WY's event at the broker: "
        f"{all(str(r['event_id']) in at_broker for r in first_rows)}; R1 "
        f"{'ok' if reply.ok else reply.error}",
    )
    _nothing_marked_before_the_broker(ctx, late_run, "after the cycle that locked before it")
    ctx.ok(r1, "relay")
    left = [str(r["event_id"])[:8] for r in checkers.outbox(ctx, late_run) if not r["published_at"]]
    ctx.progress(
        "the row committed late is published by the next cycle",
        not left,
        expected="WX's row published and marked by R1's next cycle",
        observed=f"unpublished: {left or 'none'}",
    )


def _lower_rows_given_back(ctx: ExperimentContext, relay: WorkerProcess) -> None:
    """A relay process that published a newer row while older ones were held by
    another relay, which then died with them unpublished: its next cycle
    publishes the older rows (blind hunt 55 #06: a Go relay that kept the
    highest id it had published and paged after it never looked back)."""
    low, _ = _run_with_checkpoints(ctx, "L3", LATER_EVENTS, "held then given back")
    ctx.arm("R4", "after_outbox_batch_locked", Hold())
    r4 = ctx.env.start_worker("R4", "ops")
    ctx.op_async(r4, "relay", {})
    ctx.reached("R4", "after_outbox_batch_locked")
    high, _ = _run_with_checkpoints(ctx, "L4", 1, "newer")
    ctx.ok(relay, "relay")
    newer = {str(r["event_id"]) for r in checkers.outbox(ctx, high) if r["published_at"]}
    killed = ctx.kill(r4)
    # The server ends R4's session (and its row locks) only once it notices
    # the client is gone: the next cycle skips rows still locked, so it waits
    # for that (seen on PostgreSQL 15 in CI: the cycle ran first and skipped).
    gone = seen_within(
        lambda: (
            not ctx.env.query(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = %s",
                ["R4"],
            )
            or None
        ),
        what="the killed relay R4's sessions to end",
        timeout_s=10,
    )
    ctx.ok(relay, "relay")
    rows = checkers.outbox(ctx, low)
    left = [str(r["event_id"])[:8] for r in rows if r["published_at"] is None]
    if not ctx.probe_reached(
        "a newer row published while older ones were held, their holder killed",
        bool(newer) and killed.confirmed_at is not None and bool(gone) and bool(rows),
        judges="older rows given back are published by the next cycle",
        expected="the later run's row published by R2 while R4 held the older run's rows; "
        "R4 killed and its sessions ended before R2's next cycle",
        observed=f"newer published: {sorted(e[:8] for e in newer)}; R4 {killed.detail}; its "
        f"sessions {'ended' if gone else 'still there after 10 s'}",
    ):
        return
    ctx.invariant(
        "older rows given back are published by the next cycle",
        not left,
        expected=f"each of the {len(rows)} older rows published by R2's next cycle, though R2 "
        "had published a newer row before",
        observed=f"unpublished after R2's next cycle: {left or 'none'}",
    )


def _relay_keeps_its_limit(
    ctx: ExperimentContext, relay: WorkerProcess, run_id: str, events: list[str]
) -> None:
    """A cycle with limit 1 over the run's unpublished rows publishes and marks
    one of them at most (contract section 5, relay: "up to limit"), and one at
    least: nothing else holds them. The one it takes is the oldest (a cycle
    publishes in outbox order; a batch ordered by the random event_id took
    any: blind hunt 17 #03)."""
    oldest = ctx.sql(
        "the oldest unpublished outbox row before the limit-1 cycle",
        "SELECT event_id FROM fencecheck_model.outbox WHERE published_at IS NULL "
        "AND tenant_id = %s ORDER BY id LIMIT 1",
        [ctx.env.tenant_id],
    )
    mark = checkers.audit_mark(ctx)
    reply = ctx.ok(relay, "relay", limit=1)
    marked = [
        c for c in checkers.changes_by(ctx, [relay.worker_id], after_seq=mark)
        if c["tbl"] == "outbox"
    ]  # fmt: skip
    sent = [m for m in checkers.tool_log(ctx)["messages"] if str(m["event_id"]) in events]
    published = reply.get("published") or []
    ctx.invariant(
        "a relay cycle publishes no more than its limit",
        len(published) <= 1 and len(marked) <= 1 and len(sent) <= 1,
        expected=f"relay limit 1 over {len(events)} unpublished rows: at most one event in the "
        "reply, marked (audit trail) and at the broker",
        observed=f"reply {len(published)}, rows marked {len(marked)}, broker copies {len(sent)}",
    )
    ctx.progress(
        "a relay cycle publishes what it may",
        len(published) == 1,
        expected="one event published by the limit-1 cycle (nothing else holds the rows)",
        observed=f"reply {published}",
    )
    first = str(oldest[0]["event_id"]) if oldest else None
    ctx.invariant(
        "a limit-1 relay cycle publishes the oldest unpublished row",
        all(str(m["event_id"]) == first for m in sent),
        expected=f"the broker's copy from that cycle is of the row first in outbox order ({first})",
        observed=f"broker copies {[str(m['event_id']) for m in sent]}",
    )


def _relay_then_arm(mode: str | None) -> Callable[[ExperimentContext, str, list[str]], None]:
    """Publish everything normally, then arm a delivery fault (if any) for the
    consumer's first read."""

    def publish(ctx: ExperimentContext, run_id: str, events: list[str]) -> None:
        r1 = ctx.env.start_worker("R1", "ops")
        _relay_keeps_its_limit(ctx, r1, run_id, events)
        ctx.ok(r1, "relay")
        if mode is not None:
            ctx.env.tool.client().set_fault("broker", mode)
            ctx.command(f"broker: the next read that hands out messages: {mode}")

    return publish


def _repeated(ctx: ExperimentContext, events: list[str]) -> None:
    copies = _copies(ctx, events[0])
    ctx.fault(
        "the message really repeated at the broker",
        len(copies) >= 2,
        expected="at least two broker copies of the first event",
        observed=f"{len(copies)} copies",
    )


def _delivered(mode: str, shape: str, seen: Callable[[list[int]], bool]) -> Any:
    def confirm(ctx: ExperimentContext, events: list[str]) -> None:
        del events
        reads = [d for d in checkers.tool_log(ctx)["deliveries"] if d["fault_mode"] == mode]
        ctx.fault(
            f"the broker handed a read out {shape}",
            bool(reads) and seen(reads[0]["seqs"]),
            expected=f"a delivery logged by the broker with fault {mode}, {shape}",
            observed=f"seqs handed out: {[d['seqs'] for d in reads] or 'no such read'}",
        )

    return confirm


def _copies(ctx: ExperimentContext, event_id: str) -> list[dict[str, Any]]:
    return [m for m in checkers.tool_log(ctx)["messages"] if m["event_id"] == event_id]


def _cut_at(
    ctx: ExperimentContext, point: str, name: str = "K", consumer_name: str = CONSUMER
) -> tuple[WorkerProcess, OpReply, int]:
    """A consumer process ``name`` whose first pass (as ``consumer_name``)
    loses its database link at ``point`` (healed once the pass answered): the
    process, that pass's reply, the business effects committed by then."""
    link = f"pg_{name}"
    ctx.env.add_pg_link(link)
    consumer = ctx.env.start_worker(name, "ops", pg_link=link)
    ctx.arm(name, point, Hold())
    first = ctx.op_async(consumer, "consume", {"consumer": consumer_name})
    ctx.reached(name, point)
    ctx.cut(link)
    ctx.release(name, point)
    reply = first.result(timeout_s=15)
    ctx.heal(link)
    applied = ctx.sql(
        "business effects after the failed pass",
        "SELECT count(*) AS n FROM fencecheck_model.consumer_effects WHERE consumer_name = %s",
        [consumer_name],
    )[0]["n"]
    return consumer, reply, int(applied)


def _apply_fails(ctx: ExperimentContext) -> WorkerProcess:
    """The consumer reads the whole batch, then loses its database before it
    applies any of it: that pass must fail, and the same process's later
    passes (the caller's) must still apply every event of the batch."""
    consumer, reply, applied = _cut_at(ctx, "after_consumer_read")
    handed = [d for d in checkers.tool_log(ctx)["deliveries"] if d.get("event_ids")]
    ctx.fault(
        "the consumer lost its database between its read and its first apply",
        not reply.ok
        and int(applied) == 0
        and bool(handed)
        and len(handed[0]["event_ids"]) == EVENTS,
        expected=f"the broker handed the consumer all {EVENTS} events in one read; its pass "
        "failed with the link cut and applied none of them; the process lives on",
        observed=f"first read handed out {len(handed[0]['event_ids']) if handed else 0} "
        f"event(s); the pass answered {'ok' if reply.ok else reply.error}; {applied} "
        f"effect(s) committed; K alive: {consumer.is_alive()}",
    )
    return consumer


def _cut_after_an_out_of_order_apply(ctx: ExperimentContext) -> None:
    """A third consumer name's first read comes out of order too, and its
    process loses its database right after its first apply committed (the
    highest message of the read): its next pass must apply every other event
    of that read (a position moved past the highest message applied skips
    the lower ones not applied yet: the Go reference did, found in blind hunt
    50's review)."""
    ctx.env.tool.client().set_fault("broker", "deliver_reorder")
    ctx.command("broker: the next read that hands out messages: deliver_reorder")
    reads_before = len(checkers.tool_log(ctx).get("deliveries", []))
    k2, reply, applied = _cut_at(ctx, "after_consumer_dedup_commit", "K2", THIRD_CONSUMER)
    reads = [
        d for d in checkers.tool_log(ctx).get("deliveries", [])[reads_before:] if d.get("event_ids")
    ]
    handed = [int(x) for x in (reads[0].get("seqs") or [])] if reads else []
    judged = "a read cut after its first apply is applied whole by the next pass"
    if not ctx.probe_reached(
        "the third consumer lost its database after the first apply of an out-of-order read",
        not reply.ok and applied == 1 and len(handed) > 1 and handed != sorted(handed),
        judges=judged,
        expected="one read handed out of order; the pass failed with the link cut after one "
        "effect committed",
        observed=f"read seqs {handed}; the pass answered {'ok' if reply.ok else reply.error}; "
        f"{applied} effect(s) committed",
    ):
        return
    ids = {str(e) for e in reads[0].get("event_ids", [])}
    # The first use of a session the cut closed may answer its loss.
    if not ctx.op(k2, "consume", consumer=THIRD_CONSUMER).ok:
        ctx.ok(k2, "consume", consumer=THIRD_CONSUMER)
    effects = checkers.consumer_effects(ctx, THIRD_CONSUMER)
    wrong = sorted(f"{e[:8]}: {effects.get(e, 0)} effects" for e in ids if effects.get(e) != 1)
    ctx.invariant(
        judged,
        not wrong,
        expected=f"each event of the cut read applied once by {THIRD_CONSUMER}",
        observed="; ".join(wrong) or f"{len(ids)} event(s), each applied once",
    )


@dataclass(frozen=True)
class Variant:
    """How the events get to the broker (with the variant's fault), and how the
    harness confirms the fault from the broker's log once the consumer read;
    ``consume``, when set, starts the consumer and runs its faulty first pass."""

    publish: Callable[[ExperimentContext, str, list[str]], None]
    confirm: Callable[[ExperimentContext, list[str]], None]
    consume: Callable[[ExperimentContext], WorkerProcess] | None = None
    #: Store the run's rows out of id order first (see _outbox_events).
    out_of_id_order: bool = False


def _none(ctx: ExperimentContext, events: list[str]) -> None:
    del ctx, events  # the variant confirmed its fault while publishing


VARIANTS = {
    "ack_then_crash": Variant(_ack_then_crash, _repeated),
    "publish_fails": Variant(_publish_fails, _none),
    "publish_nacked": Variant(_publish_nacked, _none),
    # Not _repeated: whether the relay sends the unanswered publish again is its
    # response, not the fault; the fault is the broker's late take.
    "late_ack": Variant(_late_ack, _none),
    "duplicate_delivery": Variant(
        _relay_then_arm("deliver_duplicate"),
        _delivered("deliver_duplicate", "with a message twice", lambda s: len(set(s)) < len(s)),
    ),
    "reordered_delivery": Variant(
        _relay_then_arm("deliver_reorder"),
        _delivered("deliver_reorder", "out of order", lambda s: s != sorted(s)),
        out_of_id_order=True,
    ),
    "concurrent_relays": Variant(_concurrent_relays, _none),
    "apply_fails": Variant(_relay_then_arm(None), _none, _apply_fails),
    LATE_COMMIT: Variant(_late_commit_in_batch, _none),
}

"""L: the relay dies after the broker acknowledged a message but before marking
it published: the message is published again, and the consumer's business
effect still happens once.
"""

from __future__ import annotations

from harness.checking import checkers
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Crash
from scenarios.common import new_run

SPEC = ExperimentSpec(
    id="L",
    title="outbox ack then crash",
    seed_section="Chinese seed §11, §13.2 (Outbox ACK 后崩溃); English seed §12",
    invariant="at-least-once: the message may repeat at the broker; the consumer's business "
    "effect happens once per event_id",
    fault="SIGKILL at after_broker_ack_before_outbox_mark",
    rules=(10,),
    injection_point="after_broker_ack_before_outbox_mark",
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx)
    w = ctx.env.start_worker("W", "ops")
    lease = ctx.ok(w, "claim", run_id=run_id)
    saved = ctx.ok(
        w,
        "save_checkpoint",
        run_id=run_id,
        epoch=lease["epoch"],
        expected_revision=lease["revision"],
        state={"step": "notify"},
    )
    event_id = str(saved["event_id"])
    ctx.arm("R1", "after_broker_ack_before_outbox_mark", Crash())
    r1 = ctx.env.start_worker("R1", "ops")
    r1.request_async("relay", {})
    code = r1.wait(15)
    ctx.command(f"R1 exited with code {code}")
    acked = [m for m in checkers.tool_log(ctx)["messages"] if m["event_id"] == event_id]
    pending = [e for e in checkers.outbox(ctx, run_id) if str(e["event_id"]) == event_id]
    ctx.fault(
        "the broker acknowledged, then the relay died before marking",
        code == -9 and len(acked) == 1 and bool(pending) and pending[0]["published_at"] is None,
        expected="R1 killed; broker holds the message once; outbox row still unpublished",
        observed=f"R1 exit {code}; broker copies {len(acked)}; outbox published_at "
        f"{pending[0]['published_at'] if pending else 'no row'}",
    )
    r2 = ctx.env.start_worker("R2", "ops")
    ctx.ok(r2, "relay")
    consumer = ctx.env.start_worker("K", "ops")
    ctx.ok(consumer, "consume", consumer="billing")
    ctx.ok(consumer, "consume", consumer="billing")  # a second pass sees nothing new
    copies = [m for m in checkers.tool_log(ctx)["messages"] if m["event_id"] == event_id]
    ctx.fault(
        "the message really repeated at the broker",
        len(copies) >= 2,
        expected="at least two broker copies of the event",
        observed=f"{len(copies)} copies",
    )
    effects = ctx.sql(
        "consumer's business effects for the event",
        "SELECT consumer_name, event_id, effect FROM consumer_effects WHERE event_id = %s",
        [event_id],
    )
    ctx.equal("business effect once", len(effects), 1, what="consumer_effects rows")
    marked = [e for e in checkers.outbox(ctx, run_id) if str(e["event_id"]) == event_id]
    ctx.invariant(
        "outbox row finally marked",
        bool(marked) and marked[0]["published_at"] is not None,
        expected="published_at set by the second relay",
        observed=f"{marked[0]['published_at'] if marked else 'no row'}",
    )

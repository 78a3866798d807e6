"""J: killed after the tool answered, with a tool that offers neither query nor
idempotency: nothing may be resent automatically; the run is frozen in doubt.
"""

from __future__ import annotations

from harness.checking import checkers
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.control import Crash
from scenarios.common import finish, new_run, wait_claimable

SPEC = ExperimentSpec(
    id="J",
    title="crash after tool response",
    seed_section="Chinese seed §8.3, §13.2 (工具响应前崩溃); English seed §9.3",
    invariant="no automatic resend; the ledger entry is in doubt (unknown); the run is paused "
    "in doubt and no worker claims it again",
    fault="SIGKILL at after_tool_response_before_tx2_commit, tool without query or idempotency",
    rules=(4, 5, 9),
    injection_point="after_tool_response_before_tx2_commit",
    natural_wait_s=0.8,
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx, tool="plain")
    ctx.arm("A", "after_tool_response_before_tx2_commit", Crash())
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"])
    code_a = finish(ctx, a)
    sent = checkers.tool_requests(ctx, run_id=run_id)
    ctx.fault(
        "the tool acted before A died",
        code_a == -9 and [r["outcome"] for r in sent] == ["created"],
        expected="A killed by SIGKILL after one created resource",
        observed=f"A exit {code_a}; tool requests {[r['outcome'] for r in sent]}",
    )
    wait_claimable(ctx, run_id)
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"])
    code_b = finish(ctx, b)
    c = ctx.env.start_worker("C", "run", ["--exit-when-idle"])
    code_c = finish(ctx, c)
    requests = checkers.tool_requests(ctx, run_id=run_id)
    ctx.equal("no automatic resend", len(requests), 1, what="requests the tool received")
    ops = checkers.ledger(ctx, run_id)
    ctx.equal("ledger in doubt", [o["status"] for o in ops], ["unknown"], what="ledger statuses")
    row = checkers.run_row(ctx, run_id)
    ctx.equal(
        "run paused in doubt",
        row["status"],
        "paused_indoubt",
        what=f"run status (B exit {code_b}, C exit {code_c})",
    )
    ctx.equal("nobody holds the frozen run", row["owner"], None, what="owner")
    checkers.lease_history_is_sound(ctx, [run_id])

"""W: every answer the tool may give the tool step is handled by what it proves.

One ``run``-mode worker works one run whose tool step meets, on its one
create, an answer the mock tool gives by schedule (docs/mock-tool.md, "The
answers a worker must handle"):

* ``conflict_other_body``: 409 under our operation_id, the existing resource
  made from *another* request body (a ``deterministic_id`` tool). It is not our
  success: the ledger must not record it; nothing new was made, nothing is
  resent, and the run stops for a person (in doubt or for a human).
* ``error_after_act``: the tool acts, then answers 500 (a tool without query or
  idempotency). A 5xx is unknown, never a failure: the ledger stays
  ``unknown``, nothing is resent (no promise makes a resend safe), the run is
  paused in doubt.
* ``accepted_without_result``: 202 without a resource id (a query tool). It is
  no result: the worker learns the remote fact by query, sends nothing again,
  records the tool's resource and finishes.
* ``late_answer``: the tool acts at once and answers after the worker's own
  tool timeout (a query tool). The timeout is unknown, not a refusal: converge
  by query, no resend, finish.

Judged from the tool's own log (requests, resources and their body digests)
and the database (ledger, run), never from the worker's account.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from scenarios.common import finish, new_run, seen_within

# The worker's tool-call timeout (FENCECHECK_TOOL_TIMEOUT_MS) and how late the
# tool answers in variant late_answer: well past it, so that the worker has
# given up on the call before the answer leaves.
TOOL_TIMEOUT_MS = 300
LATE_MS = 900


@dataclass(frozen=True)
class Answer:
    """One variant: the tool, the fault that gives the answer, what the tool's
    log says it did, and what must come of it."""

    tool: str
    mode: str
    logged: str  # the request's outcome in the tool's log
    ledger: tuple[str, ...]  # acceptable final ledger statuses of the operation
    run: tuple[str, ...]  # acceptable final run statuses
    ms: int | None = None


ANSWERS = {
    "conflict_other_body": Answer(
        "detid",
        "conflict_other_body",
        "conflict_other_body",
        ("unknown", "failed_final"),
        ("paused_indoubt", "paused_human"),
    ),
    "error_after_act": Answer(
        "plain", "error_5xx_after_act", "created_then_5xx", ("unknown",), ("paused_indoubt",)
    ),
    "accepted_without_result": Answer(
        "queryable",
        "accept_without_result",
        "created_then_accepted",
        ("succeeded",),
        ("succeeded",),
    ),
    "late_answer": Answer(
        "queryable", "answer_late", "created_then_late", ("succeeded",), ("succeeded",), LATE_MS
    ),
}

#: The capability level of each of the mock tool's tools (docs/mock-tool.md).
CAPABILITY = {"detid": "deterministic_id", "queryable": "query", "plain": "none"}

SPEC = ExperimentSpec(
    id="W",
    title="tool answers",
    seed_section="English seed §8, §9.2, §9.3 (capabilities, unknown); Chinese seed §8.3",
    invariant="a conflict with another body is no success; a 5xx or a late answer is unknown, "
    "never a failure or a refusal; a 202 is no result; the ledger records only the tool's "
    "resource of our request, learnt by query; nothing is resent without a promise",
    fault="the tool's one answer to the tool step, by schedule: 409 from another body, 500 "
    "after acting, 202 without a result, or an answer after the worker's timeout",
    rules=(4, 5),
    variants=tuple(ANSWERS),
    needs=(
        *needs.capabilities("workflow", "ledger"),
        *(needs.capability(f"ledger_tool:{CAPABILITY[a.tool]}", v) for v, a in ANSWERS.items()),
    ),
    variant_waits=(("late_answer", LATE_MS / 1000),),
)


def run(ctx: ExperimentContext) -> None:
    answer = ANSWERS[ctx.variant or "conflict_other_body"]
    run_id = new_run(ctx, tool=answer.tool)
    ctx.env.tool.client().set_fault(answer.tool, answer.mode, ms=answer.ms)
    ctx.command(f"tool: the next create of {answer.tool!r} answers by fault {answer.mode}")
    a = ctx.env.start_worker(
        "A",
        "run",
        ["--run-id", run_id, "--once"],
        env={"FENCECHECK_TOOL_TIMEOUT_MS": str(TOOL_TIMEOUT_MS)},
    )
    code = finish(ctx, a)
    if answer.ms is not None:
        # The worker may be done before the late answer leaves: the tool logs
        # when it sent it, and that is the proof the answer came late.
        seen_within(
            lambda: all(r.get("answered_at") for r in checkers.tool_requests(ctx, run_id=run_id)),
            what="the tool to send its late answer",
            timeout_s=answer.ms / 1000 + 5,
        )
    requests = checkers.tool_requests(ctx, run_id=run_id)
    first = requests[0] if requests else {}
    op_id = first.get("operation_id")
    resources = [r for r in checkers.tool_resources(ctx) if r["operation_id"] == op_id]
    late = (first.get("answered_at") or 0) - float(first.get("received_at") or 0)
    took = ctx.fault(
        f"the tool answered {answer.mode}",
        first.get("outcome") == answer.logged
        and first.get("fault_mode") == answer.mode
        and len(resources) == 1
        and (answer.ms is None or late * 1000 >= max(answer.ms, TOOL_TIMEOUT_MS)),
        expected=f"the run's first create logged {answer.logged!r} by fault {answer.mode}, one "
        "resource at the tool"
        + (f", answered {answer.ms} ms after it arrived" if answer.ms else ""),
        observed=f"first create {first.get('outcome')!r} by {first.get('fault_mode')!r}; "
        f"{len(resources)} resource(s); answered after {late * 1000:.0f} ms (A exit {code})",
    )
    if not took:
        # What the ledger and the run must show follows from the answer; the
        # scheduled one was not given, so none of it is judged (the verdict is
        # unknown). What holds whatever the answer is still judged below.
        ctx.not_judged(
            "the ledger, the run and the tool's log against the scheduled answer",
            expected=f"judged once the tool answered {answer.mode}",
            observed="the tool did not give the scheduled answer (see the fault check)",
        )
    else:
        _judge_the_answer(ctx, answer, run_id, str(op_id), requests, resources, code)
    checkers.recorded_results_are_the_tools(ctx, run_id)
    checkers.lease_history_is_sound(ctx, [run_id])


def _judge_the_answer(
    ctx: ExperimentContext,
    answer: Answer,
    run_id: str,
    op_id: str,
    requests: list[dict[str, Any]],
    resources: list[dict[str, Any]],
    code: int,
) -> None:
    ledger = {o["operation_id"]: o for o in checkers.ledger(ctx, run_id)}
    op = ledger.get(str(op_id), {})
    row = checkers.run_row(ctx, run_id)
    # Safety: the ledger never claims more than the answer proves, and the run
    # never ends anywhere else. Progress: A got there (a worker whose own timer
    # fired first leaves the operation unjudged and the run to a successor).
    unjudged = ("dispatching", "unknown")
    ctx.invariant(
        "the ledger claims nothing the answer does not prove",
        op.get("status") in (*answer.ledger, *unjudged),
        expected=f"ledger status of {op_id} in {list(answer.ledger)}, or not judged yet "
        f"{list(unjudged)}",
        observed=f"{op.get('status')!r} (remote_id {op.get('remote_id')!r})",
    )
    ctx.progress(
        "the ledger holds what the answer proves",
        op.get("status") in answer.ledger,
        expected=f"ledger status of {op_id} in {list(answer.ledger)}",
        observed=f"{op.get('status')!r} (remote_id {op.get('remote_id')!r})",
    )
    ctx.invariant(
        "the run ends nowhere else",
        row["status"] in (*answer.run, "running", "waiting_tool", "queued"),
        expected=f"run status in {list(answer.run)}, or still live for a successor",
        observed=f"{row['status']!r} (A exit {code})",
    )
    ctx.progress(
        "the run ends where the answer leads",
        row["status"] in answer.run,
        expected=f"run status in {list(answer.run)}",
        observed=f"{row['status']!r} (A exit {code})",
    )
    ctx.equal(
        "nothing resent",
        [r["outcome"] for r in requests],
        [answer.logged],
        what="the run's create requests in the tool's log",
    )
    if "succeeded" in answer.ledger:
        ctx.equal(
            "converged to the tool's resource",
            op.get("remote_id"),
            resources[0]["resource_id"] if resources else None,
            what=f"remote_id of {op_id}",
        )

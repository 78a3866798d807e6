"""I: a worker killed right after a checkpoint commit: the successor resumes from
the committed version and redoes no completed step.

The successor B dies too, right after its last checkpoint before the run's
terminal write (a SIGKILL there is crashed nowhere else; T only stops a
worker there with SIGTERM): the run is live with nothing left but the finish,
at its third epoch. A third worker C must end it with that one write, no
step redone, the tool step not sent again.
"""

from __future__ import annotations

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec, plain
from harness.parts.control import Continue, Crash
from scenarios.common import finish, new_run, wait_claimable, workflow_steps

SPEC = ExperimentSpec(
    id="I",
    title="crash after checkpoint commit",
    seed_section="Chinese seed §13.2 (checkpoint 后崩溃); English seed §6",
    invariant="the successor resumes from the last committed revision; no completed step is "
    "redone and no tool effect is repeated",
    fault="SIGKILL at after_checkpoint_commit (the second checkpoint of the run; then the "
    "successor's at its last checkpoint before the finish)",
    rules=(2, 5),
    injection_point="after_checkpoint_commit",
    needs=(
        *needs.capabilities("workflow", "checkpoints"),
        needs.point("after_checkpoint_commit"),
    ),
    natural_wait_s=1.6,
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx, tool="idem")
    # Let the first checkpoint pass, kill A at the second: real progress to resume from.
    ctx.arm("A", "after_checkpoint_commit", Continue(), times=1)
    ctx.arm("A", "after_checkpoint_commit", Crash(), times=1)
    a = ctx.env.start_worker("A", "run", ["--run-id", run_id, "--once"])
    code_a = finish(ctx, a)
    crashed = [
        h
        for h in ctx.env.control.hits()
        if h.worker == "A" and h.point == "after_checkpoint_commit"
    ]
    committed = checkers.checkpoints(ctx, run_id)
    last_a = max((c["revision"] for c in committed), default=0)
    ctx.fault(
        "A died right after a committed checkpoint",
        code_a == -9 and len(crashed) >= 2 and crashed[-1].revision == last_a,
        expected="A killed at its second after_checkpoint_commit, that revision committed",
        observed=f"A exit {code_a}; points hit at revisions {[h.revision for h in crashed]}; "
        f"last committed revision {last_a}",
    )
    tool_before = len(checkers.tool_requests(ctx, run_id=run_id))
    wait_claimable(ctx, run_id)
    expected_steps = workflow_steps()
    # B passes its checkpoints up to the last before the finish, and dies there.
    last_before_finish = len(expected_steps) - 1
    ctx.arm("B", "after_checkpoint_commit", Continue(), times=last_before_finish - last_a - 1)
    ctx.arm("B", "after_checkpoint_commit", Crash(), times=1)
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"])
    code_b = finish(ctx, b)
    crashed_b = [
        h
        for h in ctx.env.control.hits()
        if h.worker == "B" and h.point == "after_checkpoint_commit"
    ]
    last_b = max((c["revision"] for c in checkers.checkpoints(ctx, run_id)), default=0)
    ctx.fault(
        "B died right after its last checkpoint before the finish",
        code_b == -9 and bool(crashed_b) and crashed_b[-1].revision == last_b,
        expected=f"B killed at its after_checkpoint_commit of revision {last_before_finish} "
        "(the write before the terminal one), that revision committed",
        observed=f"B exit {code_b}; points hit at revisions {[h.revision for h in crashed_b]}; "
        f"last committed revision {last_b}",
    )
    wait_claimable(ctx, run_id)
    c = ctx.env.start_worker("C", "run", ["--run-id", run_id, "--once"])
    code_c = finish(ctx, c)
    rows = checkers.checkpoints(ctx, run_id)
    by_b = [c for c in rows if last_a < c["revision"] <= last_b]
    owners_a = {c["owner"] for c in rows if c["revision"] <= last_a}  # "A/<session>"
    revisions = [c["revision"] for c in rows]
    ctx.equal(
        "revisions gapless",
        revisions,
        list(range(revisions[0], revisions[0] + len(rows))) if rows else [],
        what="checkpoint revisions",
    )
    b_wrote = [(c["revision"], c["epoch"], c["owner"]) for c in by_b]
    by_c = [c for c in rows if c["revision"] > last_b]
    ctx.invariant(
        "successor resumed from the committed revision",
        not by_b
        or (
            by_b[0]["revision"] == last_a + 1
            and not any(c["owner"] in owners_a or c["owner"].startswith("A/") for c in by_b)
            and all(c["epoch"] > crashed[-1].epoch for c in by_b if crashed[-1].epoch is not None)
        ),
        expected=f"B's first checkpoint (if any) is revision {last_a + 1}, by another owner "
        "than A, at a newer epoch",
        observed=f"B's checkpoints {b_wrote} (B exit {code_b})",
    )
    ctx.progress(
        "successor wrote",
        bool(by_b),
        expected="B committed checkpoints of its own",
        observed=f"B's checkpoints {b_wrote} (B exit {code_b})",
    )
    c_wrote = [(c["revision"], c["epoch"], c["owner"]) for c in by_c]
    b_epochs = {h.epoch for h in crashed_b if h.epoch is not None}
    ctx.invariant(
        "the third worker resumed from B's last revision",
        not by_c
        or (
            by_c[0]["revision"] == last_b + 1
            and not any(c["owner"].startswith(("A/", "B/")) for c in by_c)
            and all(c["epoch"] > e for c in by_c for e in b_epochs)
        ),
        expected=f"C's first checkpoint (if any) is revision {last_b + 1}, by C, at a newer "
        "epoch than B's",
        observed=f"C's checkpoints {c_wrote} (C exit {code_c})",
    )
    # "Redone" judged on facts the contract defines (§7): the current_step each
    # protected write gave the run (audit trail), against the workflow's own
    # sequence, and the tool's log for the tool step. A successor stopped by
    # its own timers leaves a prefix of the sequence, never a repeat.
    steps = [w["current_step"] for w in checkers.writes(ctx, run_id)]
    ctx.invariant(
        "no step redone",
        steps == expected_steps[: len(steps)],
        expected=f"current_step of each protected write, in revision order: the workflow's "
        f"sequence or a prefix of it ({plain(expected_steps)})",
        observed=plain(steps),
    )
    requests = checkers.tool_requests(ctx, run_id=run_id)
    ctx.invariant(
        "tool step sent at most once",
        len(requests) <= 1,
        expected="at most 1 create request for the run",
        observed=f"create requests the tool received for run {run_id[:8]}: {len(requests)}",
    )
    ctx.command(f"tool requests before B took over: {tool_before}")
    checkers.one_resource_per_operation(ctx, run_id)
    ctx.progress_equal(
        "run finished, every step once",
        (checkers.run_row(ctx, run_id)["status"], steps, len(requests)),
        ("succeeded", expected_steps, 1),
        what=f"(run status, steps, tool requests) (C exit {code_c}, from a state with only "
        "the finish left)",
    )
    checkers.lease_history_is_sound(ctx, [run_id])

"""B: an owner paused past its lease expiry cannot touch the run after a takeover.

A holds the lease with a live heartbeat thread. The harness freezes A's whole
process with SIGSTOP (a sleep inside A would not stop its heartbeat), waits
until the lease has expired by the database's clock, lets B take over and
write, then resumes A and has it renew, save and release with its old epoch.
Last, B releases its lease and writes once more under it: the run has no
owner now, and that write is refused as definitely as the others (the
worker's history says `fail`, never `info`: no fault was on its link).

Then one ``ops`` process H holds two leases with a heartbeat each, at once,
and gives the first up with its heartbeat still running (whose next renewal
is refused, which cancels that lease's work only); H claims the first run
again at the next epoch. Writes under that new lease and under the second
lease, whose heartbeat ran beside the other's throughout, are accepted: a
process keeps each lease's heartbeat and cancellation apart.
"""

from __future__ import annotations

import time
from typing import Any

from harness.checking import checkers
from harness.checking.history import load_history, select
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.processes import WorkerProcess
from scenarios.common import new_run, seen_within

SPEC = ExperimentSpec(
    id="B",
    title="old owner resumes",
    seed_section="English seed §1, §11 B; Chinese seed §13.2 (expired fence)",
    invariant="after B's takeover, A's renew, save and release are all rejected and B's "
    "epoch, revision and state are untouched",
    fault="SIGSTOP A past lease expiry; B takes over and writes; SIGCONT A",
    rules=(1, 2, 8),
    layer="queue",
    lease_ttl_ms=800,
    natural_wait_s=0.8,
)


def run(ctx: ExperimentContext) -> None:
    run_id = new_run(ctx)
    a = ctx.env.start_worker("A", "ops")
    b = ctx.env.start_worker("B", "ops")
    # Started now, not after B's claim: a process start under load can outlast
    # B's lease, and a write refused for B's expiry proves nothing about the
    # owner+epoch check this session is there to probe.
    a2 = ctx.env.start_worker("A2", "ops")
    # What the system offers decides which of A's calls exist (a queue without
    # progress writes has no checkpoint to save); none of it excuses a stale
    # call that lands: a system without a fencing token runs B all the same.
    caps = ctx.system.capabilities
    lease_a = ctx.ok(a, "claim", run_id=run_id)
    epoch_a, rev = lease_a["epoch"], lease_a["revision"]
    if caps.offers_op("heartbeat"):
        ctx.ok(
            a,
            "heartbeat",
            run_id=run_id,
            epoch=epoch_a,
            action="start",
            interval_ms=ctx.env.heartbeat_ms,
            timeout_ms=ctx.env.heartbeat_timeout_ms,
        )
    if caps.checkpoints:
        rev = ctx.ok(
            a,
            "save_checkpoint",
            run_id=run_id,
            epoch=epoch_a,
            expected_revision=rev,
            state={"step": "by A"},
        )["revision"]

    stopped = ctx.pause(a)
    checkers.wait_lease_expired(ctx, run_id)
    expired = checkers.run_row(ctx, run_id, "run with A stopped, before B's claim")
    lease_b = ctx.ok(b, "claim", run_id=run_id)
    epoch_b = lease_b["epoch"]
    rev_b = lease_b["revision"]
    if caps.checkpoints:
        rev_b = ctx.ok(
            b,
            "save_checkpoint",
            run_id=run_id,
            epoch=epoch_b,
            expected_revision=lease_b["revision"],
            state={"step": "by B"},
        )["revision"]
    state_a = a.kernel_state()
    checkers.run_row(ctx, run_id, "run after B's takeover, before A resumes")
    resumed = ctx.resume(a)

    ctx.fault(
        "A was stopped in the kernel while B took over",
        stopped.state == "stopped" and state_a == "stopped" and bool(expired["lease_expired"]),
        expected="A stopped in the kernel, its lease expired by database time, during B's claim",
        observed=f"A state at pause {stopped.state!r}, after B's write {state_a!r}; lease "
        f"expired before B's claim: {expired['lease_expired']}; A resumed at "
        f"{resumed.confirmed_at}",
    )
    if caps.fencing_token:
        ctx.invariant(
            "B took over with the next epoch",
            epoch_b == epoch_a + 1,
            expected=f"epoch {epoch_a + 1}",
            observed=f"epoch {epoch_b}",
        )
    else:  # nothing tells the holders apart but who they are
        ctx.invariant(
            "B took over",
            lease_b["owner"] != lease_a["owner"],
            expected=f"a holder other than A ({lease_a['owner']})",
            observed=f"holder {lease_b['owner']}",
        )
    renew = ctx.op(a, "renew", run_id=run_id, epoch=epoch_a) if caps.offers_op("renew") else None
    save = (
        ctx.op(
            a,
            "save_checkpoint",
            run_id=run_id,
            epoch=epoch_a,
            expected_revision=rev,
            state={"step": "stale A"},
        )
        if caps.checkpoints
        else None
    )
    # B renews first: under load the time since B's claim can outlast its
    # lease, and a write refused for B's expiry proves nothing about the
    # owner+epoch check probed next.
    if caps.offers_op("renew"):
        ctx.ok(b, "renew", run_id=run_id, epoch=epoch_b)
    before = checkers.run_row(ctx, run_id, "run after B's renewal, before A's stale writes")
    # A's session at the revision B's write left, sent by a process that has not
    # noticed the loss (A's own may refuse client-side once its heartbeat failed):
    # only the database's owner+epoch check can refuse it.
    save_current = (
        ctx.op(
            a2,
            "save_checkpoint",
            run_id=run_id,
            epoch=epoch_a,
            owner=lease_a["owner"],
            expected_revision=rev_b,
            state={"step": "stale A at B's revision"},
        )
        if caps.checkpoints
        else None
    )
    # And the same session finishing the run B now holds.
    complete = ctx.op(
        a2,
        "complete",
        run_id=run_id,
        epoch=epoch_a,
        owner=lease_a["owner"],
        expected_revision=rev_b,
        result={"by": "stale A"},
    )
    live = checkers.run_row(ctx, run_id, "run after A's stale writes at B's revision")
    ctx.fault(
        "B's lease was live when A's stale write arrived",
        not live["lease_expired"],
        expected="B's lease unexpired by database time after A2's writes (so only the "
        "owner+epoch check could refuse them)",
        observed=f"B's lease expires at {live['lease_expires_at']}, expired: "
        f"{live['lease_expired']}",
    )
    release = ctx.op(a, "release", run_id=run_id, epoch=epoch_a)
    for name, reply in (
        ("renew", renew),
        ("save", save),
        ("save at the current revision", save_current),
        ("completion at the current revision", complete),
        ("release", release),
    ):
        if reply is None:
            continue
        ctx.invariant(
            f"A's {name} rejected",
            not reply.ok,
            expected="rejected (LeaseLost)",
            observed="accepted" if reply.ok else f"rejected: {reply.error}",
        )
    after = checkers.run_row(ctx, run_id, "run after A's attempts")
    ctx.equal(
        "B's lease untouched",
        (after["owner"], after["epoch"], after["revision"], after["lease_expires_at"]),
        (before["owner"], before["epoch"], before["revision"], before["lease_expires_at"]),
        what="(owner, epoch, revision, lease_expires_at)",
    )
    if caps.revision_check:
        ctx.equal("B's revision is the last", after["revision"], rev_b, what="agent_runs.revision")
    b_grant = min(
        (
            r["seq"]
            for r in checkers.audit(ctx, run_id)
            if r["owner"] == lease_b["owner"] and r["old_owner"] != lease_b["owner"]
        ),
        default=0,
    )
    late = checkers.changes_by(ctx, ["A", "A2"], after_seq=b_grant)
    ctx.invariant(
        "no change by A after the takeover",
        b_grant > 0 and not late,
        expected="no audited change of any contract table by A's sessions (A, A2) after B's claim",
        observed=f"{len(late)} change(s) by A: {[(r['seq'], r['tbl'], r['op']) for r in late]}"
        if late
        else f"none after audit position {b_grant}",
    )
    if caps.checkpoints and caps.offers_op("release"):
        _write_after_release(ctx, b, run_id, epoch_b)
    checkers.lease_history_is_sound(ctx, [run_id])
    if caps.checkpoints and caps.offers_op("heartbeat") and caps.offers_op("release"):
        _heartbeats_in_one_process(ctx)


# H's leases, renewals and their bound: far from any timeout on a busy machine,
# since what is judged is how one process keeps two heartbeats apart.
H_LEASE_MS = 4000
H_INTERVAL_MS = 150
H_TIMEOUT_MS = 1500
# How long both heartbeats run side by side, and how long the harness waits
# for H's history to record the first one's refused renewal after its lease
# was given up (recording renewals is optional, so it goes on without one).
BESIDE_S = 1.2
REFUSED_S = 3.0
# How long the harness keeps the run's row after it stopped H's heartbeat
# whose renewal waits on it: within that renewal's bound.
STOP_HELD_S = 0.3
WRITES_UNDER_H = "writes under each of H's live leases were accepted"
WRITE_AFTER_STOP = "a write under the lease after its heartbeat's stop was accepted"


def _heartbeats_in_one_process(ctx: ExperimentContext) -> None:
    """Two heartbeats in one process, one of them refused, and the same run
    claimed again at the next epoch (blind hunt 44 #07: the Go heartbeats of
    one process shared one connection; #09: kept by run, not by run and
    epoch, so the refused one's cancellation refused the new lease's write)."""
    h = ctx.env.start_worker("H", "ops", env={"FENCECHECK_LEASE_TTL_MS": str(H_LEASE_MS)})
    runs = [new_run(ctx), new_run(ctx)]
    leases = [ctx.ok(h, "claim", run_id=r) for r in runs]
    for run_id, lease in zip(runs, leases, strict=True):
        ctx.ok(h, "heartbeat", run_id=run_id, epoch=lease["epoch"], action="start",
               interval_ms=H_INTERVAL_MS, timeout_ms=H_TIMEOUT_MS)  # fmt: skip
    started = time.time()
    ctx.command(f"observe H's two heartbeats side by side for {BESIDE_S} s")
    time.sleep(BESIDE_S)
    ctx.ok(h, "release", run_id=runs[0], epoch=leases[0]["epoch"])
    released_at = time.time()
    refused = seen_within(
        lambda: [
            e
            for e in select(load_history([h.events_path]), op="renew", run_id=runs[0])
            if e.type in ("fail", "info") and e.time >= released_at
        ],
        what=f"H's history to record its refused renewal of {runs[0]}",
        timeout_s=REFUSED_S,
    )
    ctx.command(
        f"H gave up {runs[0]} with its heartbeat running; its renewal after that: "
        f"{[(e.type, e.epoch) for e in refused] if refused else 'none recorded'}"
    )
    again = ctx.ok(h, "claim", run_id=runs[0])
    if not ctx.probe_reached(
        "H holds the first run again at the next epoch",
        int(again["epoch"]) == int(leases[0]["epoch"]) + 1,
        judges=WRITES_UNDER_H,
        expected=f"epoch {int(leases[0]['epoch']) + 1}",
        observed=f"epoch {again['epoch']}",
    ):
        return
    writes = [
        ctx.op(
            h,
            "save_checkpoint",
            run_id=run_id,
            epoch=lease["epoch"],
            expected_revision=lease["revision"],
            state={"step": "by H"},
        )
        for run_id, lease in ((runs[0], again), (runs[1], leases[1]))
    ]
    rows = [checkers.run_row(ctx, r, f"{r} after H's writes") for r in runs]
    ctx.progress(
        WRITES_UNDER_H,
        all(w.ok for w in writes),
        expected=f"H's write under {runs[0]} at epoch {again['epoch']} (claimed again) and under "
        f"{runs[1]} (its heartbeat beside the other's all along) both accepted",
        observed=f"{[w.result if w.ok else f'{w.error}: {w.message}' for w in writes]}; runs "
        f"{[(r['owner'], r['epoch'], r['revision'], r['lease_expired']) for r in rows]}",
        since=started,
    )
    if writes[1].ok:
        _stopped_with_a_renewal_waiting(ctx, h, runs[1], leases[1])
    checkers.lease_history_is_sound(ctx, runs)


def _stopped_with_a_renewal_waiting(
    ctx: ExperimentContext, h: WorkerProcess, run_id: str, lease: dict[str, Any]
) -> None:
    """H's heartbeat of ``run_id`` is stopped while its renewal waits on the
    run's row (the harness holds it locked), and the row is let go soon after:
    the stop is no cancellation, so H's next write under the live lease is
    accepted (blind hunt 45 #02: a stop that closed the heartbeat's connection
    under its waiting renewal made that renewal unconfirmed, which cancelled
    the lease's work)."""
    with checkers.row_locked(ctx, "agent_runs", "run_id", run_id):
        waiting = seen_within(
            lambda: (
                ctx.env.query(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = 'H' AND wait_event_type = 'Lock'"
                )
                or None
            ),
            what="H's renewal to wait on the run's row the harness holds",
            timeout_s=5,
        )
        stop = ctx.op_async(
            h, "heartbeat", {"run_id": run_id, "epoch": lease["epoch"], "action": "stop"}
        )
        ctx.command(f"hold the row {STOP_HELD_S} s past the stop, then let it go")
        time.sleep(STOP_HELD_S)
    stopped = stop.result(15)
    if not ctx.probe_reached(
        "H's heartbeat was stopped while its renewal waited on the run's row",
        bool(waiting) and stopped.ok,
        judges=WRITE_AFTER_STOP,
        expected="a session of H waiting on a lock when the stop was sent; the stop answered",
        observed=f"waiting: {waiting}; stop {'ok' if stopped.ok else stopped.error}",
    ):
        return
    row = checkers.run_row(ctx, run_id, "the run after H's heartbeat stopped")
    after = ctx.op(
        h,
        "save_checkpoint",
        run_id=run_id,
        epoch=lease["epoch"],
        expected_revision=row["revision"],
        state={"step": "after the stop"},
    )
    ctx.progress(
        WRITE_AFTER_STOP,
        after.ok or bool(row["lease_expired"]),
        expected=f"H's write under {run_id} at epoch {lease['epoch']} accepted (a stop cancels "
        "nothing; the lease still live)",
        observed=f"{'ok' if after.ok else f'{after.error}: {after.message}'}; lease expired "
        f"{row['lease_expired']}",
    )


def _write_after_release(ctx: ExperimentContext, b: WorkerProcess, run_id: str, epoch: int) -> None:
    """B gives its lease up, then writes under it: the run has no owner, so the
    write is refused, and the server's refusal is a definite one in B's
    history (blind hunt 40 #08: a lease check comparing the owner
    with `=` met NULL, the Go worker took the scan error for a lost
    connection and recorded the refusal as an unknown outcome)."""
    ctx.ok(b, "release", run_id=run_id, epoch=epoch)
    released = checkers.run_row(ctx, run_id, "the run once B released it")
    before = len(load_history([b.events_path]))
    save = ctx.op(
        b,
        "save_checkpoint",
        run_id=run_id,
        epoch=epoch,
        expected_revision=released["revision"],
        state={"step": "B after its release"},
    )
    after = checkers.run_row(ctx, run_id, "the run after B's write under its released lease")
    ctx.invariant(
        "a write under a released lease is refused",
        not save.ok and after["revision"] == released["revision"],
        expected=f"refused, the run still at revision {released['revision']} with no owner",
        observed=f"{'accepted' if save.ok else save.error}; run at revision "
        f"{after['revision']}, owner {after['owner']}",
    )
    told = [
        e.type
        for e in select(load_history([b.events_path])[before:], op="save_checkpoint")
        if e.type != "invoke"
    ]
    ctx.invariant(
        "B's history records the refusal as definite",
        told == ["fail"],
        expected="one `fail` line for the refused write (the server answered; nothing was "
        "cut): never `info`, an outcome B does not know",
        observed=f"B's history after the write: {told or 'nothing'}; reply "
        f"{save.error}: {save.message}",
    )

"""The global invariants as one step of every experiment.

Called by the runner once the scenario has run and its workers are stopped
(their histories final): gathers the evidence, judges every invariant, keeps
the results for the archive, and returns the verdict the experiment ends
with. A broken invariant that the experiment does not exempt is a *fail*
whatever else happened, also when a fault did not take effect: a broken
invariant observed on the way to a fault state is evidence of its own.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from functools import cache

from harness.checking.history import read_history
from harness.checking.invariants.gather import gather
from harness.checking.invariants.paths import path_per_write, paths_taken
from harness.checking.invariants.registry import check
from harness.checking.worker_logs import read_worker_logs
from harness.engine.experiment import ExperimentContext
from harness.evidence.archive import fields_of
from harness.verdict import Verdict


@cache
def declared_write_paths(worker_cmd: tuple[str, ...]) -> dict[str, str]:
    """``<worker-cmd> write-paths``: {path name: text its statement contains}.

    Optional for a worker (contract §1): a command that does not offer it, or
    answers something else than a JSON object of strings, declares none.
    """
    try:
        proc = subprocess.run(
            [*worker_cmd, "write-paths"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        loaded = json.loads(proc.stdout) if proc.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {str(k): str(v) for k, v in loaded.items() if isinstance(v, str) and v}


def exemptions(ctx: ExperimentContext) -> dict[str, str]:
    return {
        e.invariant: e.reason
        for e in ctx.spec.exemptions
        if not e.variants or ctx.variant in e.variants
    }


def judge(ctx: ExperimentContext, verdict: Verdict, reason: str) -> tuple[Verdict, str]:
    """Judge the global invariants on the experiment's history; the final verdict."""
    env = ctx.env
    worker_cmd: Sequence[str] = env.shared.settings.worker_cmd
    exempt = exemptions(ctx)
    try:
        ctx.flush_ops()  # an answer nobody read is judged too
        evidence = gather(
            lambda q, p: env.query(q, p),
            tool_export=env.tool.client().export(),
            history=read_history(env.event_files()).events,
            lease_ttl_ms=env.lease_ttl_ms,
            lease_ttl_ms_by_app={
                name: proc.lease_ttl_ms
                for name, proc in env.workers.items()
                if proc.lease_ttl_ms is not None
            },
            # Every worker the harness started has one: its own or the experiment's.
            dispatch_ttl_ms_by_app={
                name: proc.dispatch_ttl_ms or env.dispatch_ttl_ms
                for name, proc in env.workers.items()
            },
            worker_logs=read_worker_logs(
                path
                for proc in env.workers.values()
                for path in (proc.stdout_log, proc.stderr_log, proc.events_path)
            ),
            write_paths=declared_write_paths(tuple(worker_cmd)),
            asked_write_path=ctx.spec.write_path_for(ctx.variant),
            replies=ctx.ops_log,
            functions_called=env.functions_called,
            statements_called=env.statements_called,
            server_counts_unknown=env.server_counts_unknown,
            worker_lifetimes_s=[
                (w.ended_at or time.time()) - w.started_at
                for w in env.started_workers
                if w.started_at is not None
            ],
            history_restarts=[
                {
                    "worker": w.worker_id,
                    "bytes_before": w.history_before[0],
                    "kept": w.history_kept(),
                }
                for w in env.started_workers
                if w.history_before is not None
            ],
            connection_attempts=env.connection_attempts,
            connections_unknown=env.connections_unknown,
            link_cuts=env.link_cuts,
        )
        results = check(evidence, exempt)
    except Exception as exc:
        ctx.extra["global_invariants"] = {"error": f"{type(exc).__name__}: {exc}"}
        ctx.invariant(
            "global invariants judged",
            False,
            expected="the evidence gathered and every global invariant judged",
            observed=f"{type(exc).__name__}: {exc}",
        )
        if verdict is Verdict.FAIL:
            return verdict, reason
        return Verdict.UNKNOWN, f"global invariants could not be judged: {exc}"
    ctx.extra["global_invariants"] = {
        "results": [fields_of(r) for r in results],
        "exemptions": exempt,
        "write_path_asked": ctx.spec.write_path_for(ctx.variant),
        "write_paths_declared": evidence.write_paths,
        "write_paths_taken": paths_taken(evidence),
        "write_path_per_write": path_per_write(evidence),
        "audit_changes": len(evidence.changes),
    }
    shown = [r for r in results if not r.ok]
    for r in shown:
        ctx.invariant(
            f"global: {r.name}" + (" (exempt)" if r.exempt else ""),
            r.exempt is not None,
            expected=r.expected,
            observed=f"{r.observed}; rows: {json.dumps(r.violations[:3], default=str)}"
            + (f"; exempt: {r.exempt}" if r.exempt else ""),
        )
    if not shown:
        ctx.invariant(
            f"global invariants ({len(results)})",
            True,
            expected="every global invariant holds",
            observed=f"all {len(results)} held",
        )
    broken = [r.name for r in results if r.broken]
    if not broken:
        return verdict, reason
    why = "global invariant broken: " + "; ".join(broken)
    if verdict is not Verdict.PASS:
        why += f" (the experiment itself: {verdict.value}: {reason})"
    return Verdict.FAIL, why

"""Run experiments: environment up, scenario, evidence gathered, archive written.

The runner, not the scenario, gathers the raw evidence every archive carries
(the mock tool's own log, the workers' histories, the control-socket hits,
the toxiproxy fault journal, the audit trail of lease changes), so no
scenario can forget it and no worker can supply it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.checking import checkers
from harness.checking.history import read_history, timeline
from harness.checking.invariants import experiment as invariants
from harness.engine.environment import Environment, SharedServices, experiment_environment
from harness.engine.experiment import ExperimentContext, ExperimentSpec, Inconclusive
from harness.evidence import archive as evidence
from harness.evidence.summary import ExperimentResult, failed_check_lines
from harness.verdict import Verdict

Progress = Callable[[str], None]


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds")


def _ms(value: int) -> str:
    return f"{value}ms"


@dataclasses.dataclass(frozen=True)
class Job:
    module: ModuleType
    variant: str | None
    repeat_index: int

    @property
    def spec(self) -> ExperimentSpec:
        spec: ExperimentSpec = self.module.SPEC
        return spec

    @property
    def label(self) -> str:
        base = self.spec.id + (f"-{self.variant}" if self.variant else "")
        return base + (f"-r{self.repeat_index}" if self.repeat_index else "")


def jobs_for(modules: Sequence[ModuleType], repeat: int) -> list[Job]:
    jobs: list[Job] = []
    for index in range(repeat):
        for module in modules:
            variants: Sequence[str | None] = module.SPEC.variants or (None,)
            jobs.extend(Job(module, v, index) for v in variants)
    return jobs


def run_job(
    shared: SharedServices,
    job: Job,
    *,
    report_dir: Path,
    seed: int | None,
    progress: Progress = lambda _m: None,
) -> ExperimentResult:
    """One experiment, start to archive. Never raises for what the experiment does:
    a harness failure becomes verdict *unknown* with the error in the archive."""
    spec = job.spec
    started = time.time()
    progress(f"{job.label}: {spec.title} ...")
    archive_path = report_dir / "archives" / f"{job.label}.yaml"
    logs_dir = report_dir / "logs" / job.label
    harness_error: str | None = None
    verdict, reason = Verdict.UNKNOWN, "not run"
    archive: dict[str, Any] = {}
    secrets: set[str] = set()
    try:
        with experiment_environment(
            shared,
            job.label,
            lease_ttl_ms=spec.lease_ttl_ms,
            heartbeat_ms=spec.heartbeat_ms,
            heartbeat_timeout_ms=spec.heartbeat_timeout_ms,
            dispatch_ttl_ms=spec.dispatch_ttl_ms,
            replication=_replication_for(spec, job.variant),
            tool_retention_s=dict(spec.tool_retention).get(job.variant or ""),
            log_dir=logs_dir,
            write_path=spec.write_path,
        ) as env:
            ctx = ExperimentContext(spec=spec, env=env, variant=job.variant, seed=seed)
            watchdog = threading.Timer(spec.timeout_s, env.abort, args=(spec.timeout_s,))
            watchdog.daemon = True
            watchdog.start()
            try:
                job.module.run(ctx)
                verdict, reason = ctx.verdict()
            except Inconclusive as exc:
                verdict, reason = Verdict.UNKNOWN, f"inconclusive: {exc}"
            except Exception as exc:
                harness_error = traceback.format_exc()
                verdict, reason = Verdict.UNKNOWN, f"harness error: {type(exc).__name__}: {exc}"
                # An invariant that already broke, with every fault confirmed,
                # is evidence of its own: a later error does not erase it.
                checked, why = ctx.verdict()
                if checked is Verdict.FAIL:
                    verdict, reason = checked, f"{why} (then harness error: {exc})"
            finally:
                watchdog.cancel()
            if env.aborted:
                verdict, reason = Verdict.UNKNOWN, f"aborted: {env.aborted}"
            # Stop the workers before reading their histories: the files are final.
            env.stop_workers()
            verdict, reason = invariants.judge(ctx, verdict, reason)
            archive = _archive(ctx, env, job, started, verdict, reason, harness_error, logs_dir)
            secrets = env.secrets
    except Exception as exc:
        harness_error = traceback.format_exc()
        verdict, reason = Verdict.UNKNOWN, f"environment error: {type(exc).__name__}: {exc}"
    finished = time.time()
    if not archive:
        archive = _minimal_archive(shared, job, started, verdict, reason, harness_error, logs_dir)
    archive.update(
        finished_at=_iso(finished),
        duration_s=round(finished - started, 3),
        pass_or_fail=verdict.value,
        verdict_reason=reason,
    )
    written: Path | None = None
    try:
        written = evidence.write_archive(archive_path, archive, secrets)
    except Exception as exc:
        verdict, reason = Verdict.UNKNOWN, f"archive not written: {exc}"
    failed = failed_check_lines(archive.get("checks", []))
    result = ExperimentResult(
        experiment_id=spec.id,
        title=spec.title,
        variant=job.variant,
        repeat_index=job.repeat_index,
        verdict=verdict,
        reason=reason,
        duration_s=finished - started,
        natural_wait_s=spec.natural_wait(job.variant),
        archive_path=written,
        invariant=spec.invariant,
        failed_checks=failed,
    )
    progress(f"{job.label}: {verdict.value.upper()} in {result.duration_s:.2f}s ({reason})")
    return result


def _replication_for(spec: ExperimentSpec, variant: str | None) -> Any:
    if spec.replication is None:
        return None
    if variant and variant.startswith("sync"):
        return "sync"
    if variant and variant.startswith("async"):
        return "async"
    return spec.replication


def _archive(
    ctx: ExperimentContext,
    env: Environment,
    job: Job,
    started: float,
    verdict: Verdict,
    reason: str,
    harness_error: str | None,
    logs_dir: Path,
) -> dict[str, Any]:
    spec = job.spec
    settings = env.shared.settings
    tool_log: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        tool_log = checkers.tool_log(ctx)
    history = read_history(env.event_files())
    events = history.events
    hits = env.control.hits()
    faults = env.shared.toxiproxy.journal() if env.shared.toxiproxy else []
    faults = [f for f in faults if f.link.startswith(env.tag)]
    audit: list[dict[str, Any]] = []
    with contextlib.suppress(Exception):
        audit = checkers.audit(ctx)
    facts: dict[str, str] = {}
    with contextlib.suppress(Exception):
        facts = env.primary.server_facts()
    commands = sorted(ctx.commands, key=lambda c: c["time"])
    run_ids: Any = ctx.run_ids[0] if len(ctx.run_ids) == 1 else (ctx.run_ids or None)
    return {
        "archive_version": 1,
        "experiment_id": spec.id,
        "title": spec.title,
        "seed_section": spec.seed_section,
        "variant": job.variant,
        "git_commit": evidence.git_commit(),
        "runtime_versions": evidence.runtime_versions(
            go_worker=evidence.go_build_version(tuple(settings.worker_cmd)),
            toxiproxy=env.shared.toxiproxy.version if env.shared.toxiproxy else None,
        ),
        "postgres_version": facts.get("version", "unknown"),
        "postgres_settings": facts,
        "deployment": {**env.shared.backend.deployment(), "replication": env.replication},
        "worker": {
            "command": settings.worker_command_text(),
            "digest": evidence.worker_digest(tuple(settings.worker_cmd)),
            "mutant": settings.mutant,
        },
        "run_id": run_ids,
        "tenant_id": env.tenant_id,
        "lease_duration": _ms(env.lease_ttl_ms),
        "heartbeat_interval": _ms(env.heartbeat_ms),
        "fault_injection_point": spec.injection_point,
        "injected_fault": spec.fault,
        "fencecheck_version": evidence.fencecheck_version(),
        "commands_executed": commands,
        "worker_logs_path": str(logs_dir),
        "postgres_queries_and_results": [dataclasses.asdict(q) for q in ctx.queries],
        "mock_tool_request_log": tool_log.get("requests", []),
        "mock_tool_resources": tool_log.get("resources", []),
        "broker_messages": tool_log.get("messages", []),
        "expected_invariant": spec.invariant,
        "observed_result": _observed(ctx),
        "pass_or_fail": verdict.value,
        "verdict_reason": reason,
        "checks": [dataclasses.asdict(c) for c in ctx.checks],
        "faults": [dataclasses.asdict(f) for f in faults],
        "control_hits": [dataclasses.asdict(h) for h in hits],
        "history": [dataclasses.asdict(e) for e in events]
        + [{"unreadable_line": str(p)} for p in history.problems],
        "signals": [dataclasses.asdict(s) for s in ctx.signals],
        "audit_trail": audit,
        "timeline": timeline(events, hits, faults, signals=ctx.signals, notes=_audit_notes(audit)),
        "failover": ctx.extra.get("failover"),
        "explore": ctx.extra.get("explore"),
        "metrics": env.metrics,
        "global_invariants": ctx.extra.get("global_invariants"),
        "seed": ctx.seed,
        "repeat_index": job.repeat_index,
        "started_at": _iso(started),
        "finished_at": _iso(time.time()),
        "duration_s": 0.0,
        "natural_wait_s": spec.natural_wait(job.variant),
        "harness_error": harness_error,
    }


def _audit_notes(audit: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """The database's own account of who held which epoch when, for the timeline."""
    notes: list[tuple[float, str]] = []
    for r in audit:
        at = r["at"].timestamp() if hasattr(r["at"], "timestamp") else 0.0
        change = []
        if r["op"] == "INSERT":
            change.append(f"created {r['status']}")
        else:
            if r["old_status"] != r["status"]:
                change.append(f"{r['old_status']}->{r['status']}")
            if r["old_epoch"] != r["epoch"]:
                change.append(f"epoch {r['old_epoch']}->{r['epoch']} owner {r['owner']}")
            elif r["old_owner"] != r["owner"]:
                change.append(f"owner {r['old_owner']}->{r['owner']}")
            if r["old_revision"] != r["revision"]:
                change.append(f"rev {r['old_revision']}->{r['revision']}")
            if not change:
                change.append("lease renewed")
        notes.append((at, f"db run={str(r['run_id'])[:8]}.. {', '.join(change)} (by {r['app']})"))
    return notes


def _observed(ctx: ExperimentContext) -> str:
    if not ctx.checks:
        return "nothing was checked"
    return "; ".join(f"[{'ok' if c.ok else 'NOT OK'}] {c.name}: {c.observed}" for c in ctx.checks)


def _minimal_archive(
    shared: SharedServices,
    job: Job,
    started: float,
    verdict: Verdict,
    reason: str,
    harness_error: str | None,
    logs_dir: Path,
) -> dict[str, Any]:
    """An archive for an experiment whose environment never came up."""
    spec = job.spec
    deployment: dict[str, Any] = {"kind": shared.backend.kind}
    with contextlib.suppress(Exception):  # the backend may be what failed
        deployment = shared.backend.deployment()
    deployment["replication"] = _replication_for(spec, job.variant)
    return {
        "archive_version": 1,
        "experiment_id": spec.id,
        "title": spec.title,
        "seed_section": spec.seed_section,
        "variant": job.variant,
        "git_commit": evidence.git_commit(),
        "runtime_versions": evidence.runtime_versions(go_worker=None, toxiproxy=None),
        "postgres_version": "unknown",
        "deployment": deployment,
        "worker": {"command": "unknown", "digest": "sha256:" + "0" * 64},
        "run_id": None,
        "tenant_id": None,
        "lease_duration": _ms(spec.lease_ttl_ms),
        "heartbeat_interval": _ms(spec.heartbeat_ms),
        "fault_injection_point": spec.injection_point,
        "injected_fault": spec.fault,
        "fencecheck_version": evidence.fencecheck_version(),
        "commands_executed": [],
        "worker_logs_path": str(logs_dir),
        "postgres_queries_and_results": [],
        "mock_tool_request_log": [],
        "broker_messages": [],
        "expected_invariant": spec.invariant,
        "observed_result": "the environment did not come up",
        "pass_or_fail": verdict.value,
        "verdict_reason": reason,
        "checks": [],
        "faults": [],
        "control_hits": [],
        "history": [],
        "repeat_index": job.repeat_index,
        "started_at": _iso(started),
        "finished_at": _iso(time.time()),
        "duration_s": 0.0,
        "natural_wait_s": spec.natural_wait(job.variant),
        "harness_error": harness_error,
    }


def run_jobs(
    shared: SharedServices,
    jobs: Sequence[Job],
    *,
    report_dir: Path,
    seed: int | None,
    parallel: int,
    progress: Progress,
) -> list[ExperimentResult]:
    """Run ``jobs``, ``parallel`` at a time; results come back in job order."""
    if parallel <= 1:
        return [
            run_job(shared, j, report_dir=report_dir, seed=seed, progress=progress) for j in jobs
        ]
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="experiment") as pool:
        futures = [
            pool.submit(run_job, shared, j, report_dir=report_dir, seed=seed, progress=progress)
            for j in jobs
        ]
        return [f.result() for f in futures]

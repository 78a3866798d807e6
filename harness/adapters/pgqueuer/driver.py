"""A thin driver of pgqueuer 1.6.0 for fencecheck (worker contract, section 14;
what it found: docs/analyses/pgqueuer.md).

Contract ops -> pgqueuer's public API (``pgqueuer.queries.Queries``), nothing else,
and no check of its own (a stale call must reach pgqueuer):
  create_run / retry_run -> Queries.enqueue on entrypoint ``fc-<task_id>``
  claim                  -> Queries.dequeue(batch_size=1, heartbeat_timeout=lease TTL)
                            (pgqueuer's own pick: queued jobs, or picked jobs whose
                            heartbeat is stale; that is its takeover)
  renew                  -> Queries.update_heartbeat([job id])
  release                -> Queries.retry_job(job, delay=0)  (what RetryRequested does)
  complete               -> Queries.log_jobs([(job, "successful", None)])  (DELETEs the
                            job from pgqueuer, logs it in pgqueuer_log: the mapping's
                            ``deleted:``)
  cancel                 -> Queries.mark_job_as_cancelled([job id])
Each ops process is one queue manager (a uuid4) that heartbeats every job it
picked with pgqueuer's own Heartbeat + HeartbeatBuffer, as QueueManager.run does
(renewal per_process: one buffer flushes every job's beat). Injection points:
after_lease_acquired (after dequeue returned), before_renew (before each job id
of a heartbeat flush, and before an explicit renew).

Modes: migrate | ops | mapping.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from pgqueuer.core import buffers, heartbeat
from pgqueuer.domain import models
from pgqueuer.domain.types import JobId, QueueManagerId
from pgqueuer.queries import EntrypointExecutionParameter, Queries

from harness import injection
from harness.adapters.ops_channel import NotClaimable, RunNotFound, serve_stdin

HERE = Path(__file__).parent

ROLES_SQL = """
DO $$
BEGIN
  CREATE ROLE fencecheck_worker NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;
DO $$
BEGIN
  CREATE ROLE fencecheck_operator NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;
GRANT USAGE ON SCHEMA public TO fencecheck_worker, fencecheck_operator;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public
  TO fencecheck_worker, fencecheck_operator;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO fencecheck_worker, fencecheck_operator;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO fencecheck_worker, fencecheck_operator;
"""


def env_ms(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


async def migrate_async() -> int:
    dsn = os.environ["FENCECHECK_ADMIN_DSN"]
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with conn:
        q = Queries.from_psycopg_connection(conn)
        if not await q.schema_is_installed():
            async with conn.transaction():
                await q.install()
        await conn.execute(ROLES_SQL.encode())
    return 0


class Sink:
    """pgqueuer's heartbeat sink, with the before_renew point in front of each flush."""

    def __init__(self, queries: Queries) -> None:
        self.queries = queries

    async def update_heartbeat(self, job_ids: list[Any]) -> None:
        for job_id in job_ids:
            await asyncio.to_thread(injection.point, "before_renew", run_id=job_id)
        try:
            await self.queries.update_heartbeat(job_ids)
            injection.record("ok", "heartbeat", detail={"jobs": [str(j) for j in job_ids]})
        except Exception as exc:
            injection.record("info", "heartbeat", error=exc)
            raise


class Driver:
    def __init__(self, q: Queries, hbq: Queries) -> None:
        self.q = q
        self.hbq = hbq
        self.qm_id = QueueManagerId(uuid.uuid4())  # this process's queue manager id
        self.ttl = timedelta(milliseconds=env_ms("FENCECHECK_LEASE_TTL_MS", 30_000))
        self.beat = timedelta(milliseconds=env_ms("FENCECHECK_HEARTBEAT_MS", 10_000))
        self.hbuff = buffers.HeartbeatBuffer(max_size=1, timeout=self.ttl / 8, repository=Sink(hbq))
        self.beats: dict[int, heartbeat.Heartbeat] = {}

    async def job(self, run_id: Any) -> models.Job:
        job = await self.q.queue_job_by_id(JobId(int(run_id)))
        if job is None:
            raise RunNotFound(f"no job {run_id} in the queue table")
        return job

    async def stop_beat(self, job_id: int) -> None:
        hb = self.beats.pop(job_id, None)
        if hb is not None:
            await hb.__aexit__(None, None, None)

    # -------------------------------------------------------------- ops
    async def create_run(self, args: dict[str, Any]) -> dict[str, Any]:
        task = str(args["task_id"])
        payload = json.dumps({"input": args.get("input") or {}, "task_id": task}).encode()
        ids = await self.q.enqueue(f"fc-{task}", payload)
        return {"run_id": str(ids[0]), "task_id": task}

    async def retry_run(self, args: dict[str, Any]) -> dict[str, Any]:
        return await self.create_run({"task_id": args["task_id"]})

    async def claim(self, args: dict[str, Any]) -> dict[str, Any]:
        if args.get("run_id") is not None:
            entrypoints = [(await self.job(args["run_id"])).entrypoint]
        else:
            entrypoints = sorted({s.entrypoint for s in await self.q.queue_size()})
        if not entrypoints:
            raise NotClaimable("no entrypoint has jobs")
        jobs = await self.q.dequeue(
            batch_size=1,
            entrypoints={e: EntrypointExecutionParameter(concurrency_limit=0) for e in entrypoints},
            queue_manager_id=self.qm_id,
            global_concurrency_limit=None,
            heartbeat_timeout=self.ttl,
        )
        if not jobs:
            raise NotClaimable("dequeue returned nothing")
        job = jobs[0]
        if job.id not in self.beats:
            hb = heartbeat.Heartbeat(job.id, self.beat, self.hbuff)
            await hb.__aenter__()
            self.beats[job.id] = hb
        await asyncio.to_thread(injection.point, "after_lease_acquired", run_id=job.id)
        return {
            "run_id": str(job.id),
            "epoch": None,
            "revision": 0,
            "status": "running",
            "owner": str(self.qm_id),
        }

    async def renew(self, args: dict[str, Any]) -> dict[str, Any]:
        await asyncio.to_thread(injection.point, "before_renew", run_id=args.get("run_id"))
        await self.q.update_heartbeat([JobId(int(args["run_id"]))])
        return {"expires_at": None}

    async def release(self, args: dict[str, Any]) -> dict[str, Any]:
        job = await self.job(args["run_id"])
        await self.stop_beat(job.id)
        await self.q.retry_job(job, timedelta(0), None)
        return {}

    async def complete(self, args: dict[str, Any]) -> dict[str, Any]:
        job = await self.job(args["run_id"])
        await self.stop_beat(job.id)
        await self.q.log_jobs([(job, "successful", None)])
        return {"revision": None, "status": "succeeded"}

    async def cancel(self, args: dict[str, Any]) -> dict[str, Any]:
        job_id = JobId(int(args["run_id"]))
        await self.stop_beat(job_id)
        await self.q.mark_job_as_cancelled([job_id])
        job = await self.q.queue_job_by_id(job_id)
        status = "cancelled" if job is None else {"picked": "running"}.get(job.status, job.status)
        return {"run_status": status, "operations": []}

    async def durability(self, args: dict[str, Any]) -> dict[str, Any]:
        del args
        return {"mode": "none", "guarantee": "pgqueuer reads no replication setting"}


OPS: dict[str, Callable[[Driver, dict[str, Any]], Awaitable[Any]]] = {
    "create_run": Driver.create_run,
    "retry_run": Driver.retry_run,
    "claim": Driver.claim,
    "renew": Driver.renew,
    "release": Driver.release,
    "complete": Driver.complete,
    "cancel": Driver.cancel,
    "durability": Driver.durability,
}


async def ops() -> int:
    dsn = os.environ["FENCECHECK_DSN"]
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    hbconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with conn, hbconn:
        driver = Driver(
            Queries.from_psycopg_connection(conn), Queries.from_psycopg_connection(hbconn)
        )
        async with driver.hbuff:
            await serve_stdin(OPS, driver)
            for job_id in list(driver.beats):
                await driver.stop_beat(job_id)
    return 0


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ""
    if mode == "mapping":
        sys.stdout.write((HERE / "fencecheck-mapping.yaml").read_text(encoding="utf-8"))
        return 0
    if mode == "migrate":
        return asyncio.run(migrate_async())
    if mode == "ops":
        return asyncio.run(ops())
    sys.stderr.write("usage: driver.py {migrate|ops|mapping}\n")
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

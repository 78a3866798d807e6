"""A thin driver of procrastinate 3.10 for fencecheck (worker contract, section 14).

It turns the contract's ops into procrastinate's own public API and nothing
else: ``claim`` is ``JobManager.fetch_job`` (after procrastinate's documented
recovery of a stalled job, ``get_stalled_jobs`` then ``retry_job``, when the
run is held by a worker whose heartbeat is older than the lease duration),
``renew`` is ``update_heartbeat`` of the worker the call names, ``release`` is
``retry_job``, ``complete`` is ``finish_job``, ``cancel`` is
``cancel_job_by_id``, ``create_run`` defers a job. Each process registers
itself as one procrastinate worker and heartbeats every
``FENCECHECK_HEARTBEAT_MS`` as procrastinate's own worker does. It checks
nothing procrastinate does not check itself: what the harness judges is
procrastinate.

Modes: ``migrate`` (procrastinate's schema, the contract's two group roles
with the rights procrastinate's functions need), ``ops`` (JSON lines),
``mapping`` (fencecheck-mapping.yaml beside this file). Each run is a job
in a queue of its own (``fc-<task_id>``), so a claim of one run is a fetch
of that queue.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from procrastinate import App, PsycopgConnector, jobs, manager

from harness import injection
from harness.adapters.ops_channel import NotClaimable, RunNotFound, serve_stdin

HERE = Path(__file__).parent
TASK = "fencecheck.run"

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


def migrate() -> int:
    """procrastinate's own schema, once (idempotent), and the group roles."""
    dsn = os.environ["FENCECHECK_ADMIN_DSN"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        present = conn.execute("SELECT to_regclass('public.procrastinate_jobs')").fetchone()
        if present is None or present[0] is None:
            # One transaction: a concurrent migrate of another database never
            # sees half a schema (roles are cluster-wide, handled below).
            with conn.transaction():
                conn.execute(schema_sql().encode())
        conn.execute(ROLES_SQL.encode())
    return 0


def schema_sql() -> str:
    """procrastinate's schema as it ships (what `procrastinate schema --apply` runs)."""
    from procrastinate import schema

    return schema.SchemaManager.get_schema()


class Driver:
    """One procrastinate worker: its id, its heartbeat, the contract's ops."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.jobs: manager.JobManager = app.job_manager
        self.worker_id: int | None = None
        self.beating: asyncio.Task[None] | None = None
        self.ttl_s = env_ms("FENCECHECK_LEASE_TTL_MS", 30_000) / 1000
        self.beat_s = env_ms("FENCECHECK_HEARTBEAT_MS", 10_000) / 1000

    async def start(self) -> None:
        self.worker_id = await self.jobs.register_worker()
        self.beating = asyncio.get_running_loop().create_task(self.heartbeat())

    async def heartbeat(self) -> None:
        """procrastinate's worker heartbeat: one row per worker, every interval."""
        assert self.worker_id is not None
        while True:
            await asyncio.sleep(self.beat_s)
            injection.point("before_renew")
            try:
                await self.jobs.update_heartbeat(self.worker_id)
                injection.record("ok", "heartbeat", detail={"worker_id": self.worker_id})
            except Exception as exc:
                injection.record("info", "heartbeat", error=exc)

    async def job(self, run_id: Any) -> jobs.Job:
        found = await self.jobs.list_jobs_async(id=int(run_id))
        for job in found:
            return job
        raise RunNotFound(f"no job {run_id}")

    # ------------------------------------------------------------ the ops
    async def create_run(self, args: dict[str, Any]) -> dict[str, Any]:
        task = str(args["task_id"])
        job = await self.jobs.defer_job_async(
            jobs.Job(
                id=None,
                queue=f"fc-{task}",
                lock=None,
                queueing_lock=None,
                task_name=TASK,
                task_kwargs={"input": args.get("input") or {}, "task_id": task},
            )
        )
        return {"run_id": str(job.id), "task_id": task}

    async def retry_run(self, args: dict[str, Any]) -> dict[str, Any]:
        # procrastinate's own retry reuses the job; a new attempt of the task
        # as a new run is a new job of its queue.
        return await self.create_run({"task_id": args["task_id"]})

    async def claim(self, args: dict[str, Any]) -> dict[str, Any]:
        assert self.worker_id is not None
        queues = None
        if args.get("run_id") is not None:
            job = await self.job(args["run_id"])
            queues = [job.queue]
            if job.status == jobs.Status.DOING.value:
                # procrastinate's recovery of stalled jobs (its documented way
                # to take a job over): retry those whose worker's heartbeat is
                # older than the lease duration.
                stalled = await self.jobs.get_stalled_jobs(seconds_since_heartbeat=self.ttl_s)
                mine = [j for j in stalled if j.id == job.id]
                if not mine:
                    raise NotClaimable(f"job {job.id} is held by a live worker")
                await self.jobs.retry_job(mine[0])
        fetched = await self.jobs.fetch_job(queues=queues, worker_id=self.worker_id)
        if fetched is None:
            raise NotClaimable("nothing to fetch")
        injection.point("after_lease_acquired", run_id=fetched.id)
        return {
            "run_id": str(fetched.id),
            "epoch": None,  # procrastinate has no fencing token
            "revision": 0,
            "status": "running",
            "owner": str(self.worker_id),
        }

    async def renew(self, args: dict[str, Any]) -> dict[str, Any]:
        owner = int(args.get("owner") or self.worker_id or 0)
        injection.point("before_renew", run_id=args.get("run_id"))
        await self.jobs.update_heartbeat(owner)
        return {"expires_at": None}

    async def release(self, args: dict[str, Any]) -> dict[str, Any]:
        await self.jobs.retry_job(await self.job(args["run_id"]))
        return {}

    async def complete(self, args: dict[str, Any]) -> dict[str, Any]:
        job = await self.job(args["run_id"])
        await self.jobs.finish_job(job, status=jobs.Status.SUCCEEDED, delete_job=False)
        return {"revision": None, "status": "succeeded"}  # no revisions

    async def cancel(self, args: dict[str, Any]) -> dict[str, Any]:
        await self.jobs.cancel_job_by_id_async(int(args["run_id"]), abort=True)
        job = await self.job(args["run_id"])
        status = {"cancelled": "cancelled", "aborted": "cancelled", "doing": "running"}
        return {"run_status": status.get(str(job.status), str(job.status)), "operations": []}

    async def durability(self, args: dict[str, Any]) -> dict[str, Any]:
        del args
        return {"mode": "none", "guarantee": "procrastinate reads no replication setting"}


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
    app = App(connector=PsycopgConnector(conninfo=dsn, kwargs={"autocommit": True}))
    async with app.open_async():
        driver = Driver(app)
        await driver.start()
        await serve_stdin(OPS, driver)
    return 0


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ""
    if mode == "mapping":
        sys.stdout.write((HERE / "fencecheck-mapping.yaml").read_text(encoding="utf-8"))
        return 0
    if mode == "migrate":
        return migrate()
    if mode == "ops":
        return asyncio.run(ops())
    sys.stderr.write("usage: driver.py {migrate|ops|mapping}\n")
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

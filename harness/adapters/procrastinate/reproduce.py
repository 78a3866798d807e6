"""Reproduce fencecheck's findings on procrastinate 3.10.0 against a bare PostgreSQL.

    python -m harness.adapters.procrastinate.reproduce "host=... dbname=... user=..."

Needs nothing of fencecheck: a PostgreSQL database it may create a schema in
(it applies procrastinate's own schema.sql to a fresh schema ``repro``) and
procrastinate 3.10.0. Two (or three) procrastinate workers are played by one
process calling procrastinate's public ``JobManager`` API, each as its own
registered worker; a worker "stalls" by not heartbeating for longer than the
stalled threshold (what a SIGSTOP, a GC pause or a VM migration does), and
the takeover is procrastinate's documented recovery: ``get_stalled_jobs``
then ``retry_job``. Each finding prints what procrastinate did and ends with
REPRODUCED or NOT REPRODUCED; the exit code is the number not reproduced.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import psycopg
from procrastinate import App, PsycopgConnector, jobs, schema

STALLED_S = 1.0  # the stalled threshold (seconds since the last heartbeat)


async def fresh(dsn: str) -> App:
    """A schema ``repro`` with procrastinate's own schema in it, and an app on it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS repro CASCADE; CREATE SCHEMA repro")
        conn.execute("SET search_path = repro")
        conn.execute(schema.SchemaManager.get_schema().encode())
    app = App(connector=PsycopgConnector(conninfo=dsn, kwargs={"options": "-c search_path=repro"}))
    await app.open_async()
    return app


async def job_row(app: App, job_id: int) -> tuple[str, int | None]:
    (job,) = await app.job_manager.list_jobs_async(id=job_id)
    return str(job.status), job.worker_id


async def stall(app: App, worker: int) -> None:
    """The worker misses its heartbeats: its last one is older than the threshold."""
    del app, worker
    await asyncio.sleep(STALLED_S + 0.5)


async def take_over(app: App, job_id: int, worker: int) -> None:
    """procrastinate's recovery: retry the stalled job, another worker fetches it."""
    stalled = await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=STALLED_S)
    (job,) = [j for j in stalled if j.id == job_id]
    await app.job_manager.retry_job(job)
    fetched = await app.job_manager.fetch_job(queues=["q"], worker_id=worker)
    assert fetched is not None and fetched.id == job_id


async def setup(app: App) -> tuple[int, int, int]:
    """A job fetched by worker A; worker B registered."""
    jm = app.job_manager
    a, b = await jm.register_worker(), await jm.register_worker()
    job = await jm.defer_job_async(
        jobs.Job(id=None, queue="q", lock=None, queueing_lock=None, task_name="t")
    )
    assert job.id is not None
    fetched = await jm.fetch_job(queues=["q"], worker_id=a)
    assert fetched is not None
    return job.id, a, b


async def stale_finish(app: App) -> bool:
    """B and R: a stale worker finishes the new attempt's job while it runs."""
    job_id, a, b = await setup(app)
    await stall(app, a)
    await take_over(app, job_id, b)
    print(f"  job {job_id} after the takeover: {await job_row(app, job_id)} (B is worker {b})")
    (stale,) = await app.job_manager.list_jobs_async(id=job_id)
    await app.job_manager.finish_job(stale, status=jobs.Status.SUCCEEDED, delete_job=False)
    status, _ = await job_row(app, job_id)
    print(f"  stale worker A ({a}) calls finish_job: accepted; job is now {status!r} while B runs")
    return status == "succeeded"


async def stale_retry(app: App) -> bool:
    """R: a stale worker hands the new attempt's running job back to the queue;
    a third worker fetches it while the second still runs it."""
    job_id, a, b = await setup(app)
    await stall(app, a)
    await take_over(app, job_id, b)
    (stale,) = await app.job_manager.list_jobs_async(id=job_id)
    await app.job_manager.retry_job(stale)
    c = await app.job_manager.register_worker()
    third = await app.job_manager.fetch_job(queues=["q"], worker_id=c)
    status, holder = await job_row(app, job_id)
    print(
        f"  stale worker A ({a}) calls retry_job: accepted; worker C ({c}) fetches job "
        f"{third.id if third else None}; job {status!r} held by {holder}, B ({b}) still runs it"
    )
    return third is not None and third.id == job_id and holder == c


async def stale_heartbeat(app: App) -> bool:
    """K: a stalled worker's heartbeat revives its lease; nobody is told it stalled."""
    job_id, a, _ = await setup(app)
    await stall(app, a)
    before = [
        j.id for j in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=STALLED_S)
    ]
    await app.job_manager.update_heartbeat(a)
    after = [
        j.id for j in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=STALLED_S)
    ]
    print(f"  stalled jobs before A's late heartbeat {before}, after {after}: accepted, no error")
    (stale,) = await app.job_manager.list_jobs_async(id=job_id)
    await app.job_manager.finish_job(stale, status=jobs.Status.SUCCEEDED, delete_job=False)
    print(f"  A then finishes the job it had stalled on: {await job_row(app, job_id)}")
    return job_id in before and job_id not in after


FINDINGS: dict[str, Callable[[App], Awaitable[bool]]] = {
    "stale finish lands (B)": stale_finish,
    "stale retry hands a running job to a third worker (R)": stale_retry,
    "a stalled worker's heartbeat revives its lease (K)": stale_heartbeat,
}


async def main(dsn: str) -> int:
    missing = 0
    for name, finding in FINDINGS.items():
        print(f"{name}:")
        app = await fresh(dsn)
        try:
            ok = await finding(app)
        finally:
            await app.close_async()
        print(f"  {'REPRODUCED' if ok else 'NOT REPRODUCED'}")
        missing += not ok
    return missing


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(asyncio.run(main(sys.argv[1])))

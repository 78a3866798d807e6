"""Reproduce fencecheck's findings on pgqueuer 1.6.0 against a bare PostgreSQL.

    python -m harness.adapters.pgqueuer.reproduce "host=... dbname=... user=..."

Needs nothing of fencecheck: a PostgreSQL database it may create a schema in
(it installs pgqueuer's own schema, ``Queries.install``, into a fresh schema
``repro``) and pgqueuer 1.6.0. Two (or three) queue managers are played by one
process calling pgqueuer's public ``Queries`` API, each with a queue manager id
of its own; a queue manager "stalls" by not heartbeating for longer than the
heartbeat timeout (what a SIGSTOP, a GC pause or a VM migration does), and the
takeover is pgqueuer's own: ``dequeue`` picks a picked job whose heartbeat is
older than ``heartbeat_timeout``. Each finding prints what pgqueuer did and
ends with REPRODUCED or NOT REPRODUCED; the exit code is the number not
reproduced.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
from pgqueuer.domain import models
from pgqueuer.domain.types import JobId, QueueEntrypoint, QueueManagerId
from pgqueuer.queries import EntrypointExecutionParameter, Queries

TIMEOUT = timedelta(seconds=1)  # the heartbeat timeout: older than this, a picked job is stale
ENTRYPOINT = QueueEntrypoint("repro")


async def connect(dsn: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, options="-c search_path=repro"
    )


async def fresh(dsn: str) -> None:
    """A schema ``repro`` holding pgqueuer's own schema."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP SCHEMA IF EXISTS repro CASCADE; CREATE SCHEMA repro")
    conn = await connect(dsn)
    async with conn:
        await Queries.from_psycopg_connection(conn).install()


class Manager:
    """One queue manager: its own connection and id."""

    def __init__(self, name: str, q: Queries) -> None:
        self.name = name
        self.q = q
        self.id = QueueManagerId(uuid.uuid4())

    async def dequeue(self) -> models.Job | None:
        jobs = await self.q.dequeue(
            batch_size=1,
            entrypoints={ENTRYPOINT: EntrypointExecutionParameter(concurrency_limit=0)},
            queue_manager_id=self.id,
            global_concurrency_limit=None,
            heartbeat_timeout=TIMEOUT,
        )
        return jobs[0] if jobs else None


async def row(q: Queries, job_id: JobId) -> str:
    job = await q.queue_job_by_id(job_id)
    if job is None:
        return "gone from pgqueuer"
    return f"{job.status}, queue_manager_id {str(job.queue_manager_id)[:8]}"


async def logged(conn: psycopg.AsyncConnection[Any], job_id: JobId) -> list[str]:
    cur = await conn.execute(
        "SELECT status FROM pgqueuer_log WHERE job_id = %s ORDER BY id", [job_id]
    )
    return [str(r[0]) for r in await cur.fetchall()]


async def stall() -> None:
    """The manager misses its heartbeats: its last one is older than the timeout."""
    await asyncio.sleep(TIMEOUT.total_seconds() + 0.5)


async def taken_over(dsn: str, managers: int = 2) -> tuple[list[Manager], JobId, Any]:
    """A job picked by manager A, stale, then picked again by manager B."""
    await fresh(dsn)
    conns = [await connect(dsn) for _ in range(managers + 1)]
    qs = [Queries.from_psycopg_connection(c) for c in conns]
    ms = [Manager(n, q) for n, q in zip("ABC", qs[1:], strict=False)]
    (job_id,) = await qs[0].enqueue(ENTRYPOINT, None)
    a, b = ms[0], ms[1]
    got = await a.dequeue()
    assert got is not None and got.id == job_id
    await stall()
    again = await b.dequeue()
    assert again is not None and again.id == job_id, "B did not take the stale job over"
    print(f"  job {job_id} after the takeover: {await row(qs[0], job_id)} (B is {str(b.id)[:8]})")
    return ms, job_id, conns


async def stale_completion(dsn: str) -> bool:
    ms, job_id, conns = await taken_over(dsn)
    a = ms[0]
    stale = await a.q.queue_job_by_id(job_id)
    assert stale is not None
    await a.q.log_jobs([(stale, "successful", None)])
    after, log = await row(a.q, job_id), await logged(conns[0], job_id)
    print(f"  stale manager A calls log_jobs(successful): accepted; job {after}, log {log}")
    for c in conns:
        await c.close()
    return after == "gone from pgqueuer" and log[-1:] == ["successful"]


async def stale_retry(dsn: str) -> bool:
    ms, job_id, conns = await taken_over(dsn, managers=3)
    a, b, c = ms
    stale = await a.q.queue_job_by_id(job_id)
    assert stale is not None
    await a.q.retry_job(stale, timedelta(0), None)
    third = await c.dequeue()
    now = await row(a.q, job_id)
    print(
        f"  stale manager A calls retry_job: accepted; manager C picks job "
        f"{third.id if third else None}; job {now}, B ({str(b.id)[:8]}) still runs it"
    )
    for conn in conns:
        await conn.close()
    return third is not None and third.id == job_id and str(c.id)[:8] in now


async def stale_heartbeat(dsn: str) -> bool:
    """K: A stalls past the timeout and nobody takes over; A's late heartbeat is
    accepted and the job is no longer stale, and A's completion lands."""
    await fresh(dsn)
    conns = [await connect(dsn) for _ in range(3)]
    ctl, a, probe = (
        Queries.from_psycopg_connection(conns[0]),
        Manager("A", Queries.from_psycopg_connection(conns[1])),
        Manager("P", Queries.from_psycopg_connection(conns[2])),
    )
    (job_id,) = await ctl.enqueue(ENTRYPOINT, None)
    assert (await a.dequeue()) is not None
    await stall()
    cur = await conns[0].execute(
        "SELECT heartbeat < now() - %s::interval FROM pgqueuer WHERE id = %s", [TIMEOUT, job_id]
    )
    (stale_before,) = await cur.fetchone() or (None,)
    await a.q.update_heartbeat([job_id])
    cur = await conns[0].execute(
        "SELECT heartbeat < now() - %s::interval FROM pgqueuer WHERE id = %s", [TIMEOUT, job_id]
    )
    (stale_after,) = await cur.fetchone() or (None,)
    picked = await probe.dequeue()  # a second manager would have taken it over: not any more
    job = await a.q.queue_job_by_id(job_id)
    assert job is not None
    await a.q.log_jobs([(job, "successful", None)])
    log = await logged(conns[0], job_id)
    print(
        f"  job stale before A's late heartbeat: {stale_before}, after: {stale_after}; "
        f"another manager's dequeue then picks {picked.id if picked else 'nothing'}"
    )
    print(f"  A then finishes the job it had stalled on: log {log}")
    for c in conns:
        await c.close()
    return bool(stale_before) and stale_after is False and picked is None


FINDINGS: list[tuple[str, Callable[[str], Awaitable[bool]]]] = [
    ("stale completion lands (B)", stale_completion),
    ("stale retry hands a running job to a third manager (R)", stale_retry),
    ("a stalled manager's heartbeat revives its lease (K)", stale_heartbeat),
]


async def main(dsn: str) -> int:
    missed = 0
    for title, finding in FINDINGS:
        print(f"{title}:")
        ok = await finding(dsn)
        print("  REPRODUCED" if ok else "  NOT REPRODUCED")
        missed += not ok
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS repro CASCADE")
    return missed


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.stderr.write(__doc__ or "")
        sys.exit(64)
    sys.exit(asyncio.run(main(sys.argv[1])))

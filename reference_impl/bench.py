"""``python -m reference_impl.bench``: the reference implementation vs pgbench.

Prints figures and ratios; asserts nothing about speed. One run starts its
own throw-away PostgreSQL cluster (``harness.parts.postgres``; the ``pgbench`` of
the same bin directory), migrates one database, and for each operation runs
``--rounds`` rounds of [pgbench, implementation] (even rounds in reverse
order), each side doing the same number of transactions of the same real
work; it prints every round, the medians and the ratio impl/pgbench:

checkpoint
    Two baselines: pgbench runs the protected checkpoint as the seeds write
    it, one statement per round trip. ``seed6`` is the six-statement form
    (the Chinese seed's: the checks in the locking SELECT): BEGIN; SELECT
    ... WHERE owner + epoch + unexpired (database time) FOR UPDATE; UPDATE
    the revision CAS ... RETURNING; INSERT the checkpoint; INSERT the outbox
    row; COMMIT. ``seed7`` is the English seed's form, the validity check a
    SELECT of its own after the lock (7 round trips). A failed check leaves
    its ``\\gset`` without a row, which aborts pgbench: every check is
    enforced. The ratio and its target are against ``seed6``, the faster
    baseline; impl/seed7 is printed too.
    ``impl``: ``ProtectedWriter.write`` in its fast path
    (``fencecheck.protected_write_fast`` in one autocommit round trip; every
    check and the row lock inside the function). Both write to the same run under
    the same lease (TTL one day). The seed connects as ``fencecheck_bench``, a
    role with just the DML grants the seed needs, under the same RLS policy
    (the worker role may not write tables directly). Two more sides explain
    the ratio: ``ideal``, pgbench calling seed7's statements wrapped in one
    plain PL/pgSQL function (created in the benchmark's database only): what
    cutting round trips alone can give; and ``stmt``, pgbench running the
    implementation's own statement as ``fencecheck_worker``: the server work
    of ``impl`` without Python.
renew
    pgbench runs the implementation's ``renew`` statement; the
    implementation runs ``Leases.renew``; same lease, both as
    ``fencecheck_worker``.
claim
    pgbench runs the implementation's ``claim`` statement; the
    implementation runs ``Leases.claim``; each side claims from a fresh queue
    (its own tenant) of exactly as many due runs as it makes claims, both as
    ``fencecheck_worker``. Every claim must be granted.

pgbench flags: ``-n -c 1 -j 1 -M prepared -t N`` (psycopg prepares the
implementation's statements from their fifth execution on). ``N`` comes
from an untimed warm-up so that a side takes about ``--seconds``. Rates
exclude connection time on both sides; the table is vacuumed (untimed)
before every side. The implementation runs on one connection with
FENCECHECK_CONTROL unset (the fast path outside the harness).

Everything started is stopped and removed at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from psycopg import sql

from harness import injection
from harness.parts.pg_binaries import PgBinaries, find_pg_binaries
from harness.parts.postgres import Database, PostgresCluster
from reference_impl.db import ConnectionSpec, Session, connect
from reference_impl.ids import canonical_json, state_hash
from reference_impl.leases import Lease, Leases
from reference_impl.migrations import migrate
from reference_impl.protected import ProtectedWriter, Write
from reference_impl.protocol import Protocol

OPS = ("checkpoint", "renew", "claim")
#: impl / pgbench rate the issue asks for, per operation.
TARGETS = {"checkpoint": 2.0, "renew": 0.8, "claim": 0.7}
#: Sides of each operation, in the order they run in a round; the first is
#: the baseline of the ratio, ``impl`` is the implementation.
SIDES = {
    "checkpoint": ("seed6", "seed7", "ideal", "stmt", "impl"),
    "renew": ("pgbench", "impl"),
    "claim": ("pgbench", "impl"),
}
LABELS = {
    "seed6": "pgbench seed (6 round trips)",
    "seed7": "pgbench seed (7 round trips)",
    "ideal": "pgbench seed in one call (1)",
    "stmt": "pgbench impl's statement (1)",
    "pgbench": "pgbench impl's statement",
    "impl": "impl (Python, 1 round trip)",
}

TENANT = "b0000000-0000-4000-8000-000000000001"
# Login roles of the bench's own cluster (worker contract v2: a session's
# tenant is its login role's binding). Queues of the claim bench get a role
# of their own each (``Bench.new_queue``).
WORKER_ROLE = "fencecheck_bench_worker"
OPERATOR_ROLE = "fencecheck_bench_operator"
SEED_ROLE = "fencecheck_bench"
TTL_MS = 86_400_000  # the longest TTL fencecheck._ms accepts: no lease expires mid-run
WARMUP = 50
MIN_TRANSACTIONS = 10

STATE: dict[str, Any] = {
    "plan": ["lookup", "refund", "notify"],
    "cursor": 1,
    "data": {"order_id": "o-1", "amount": 10},
    "results": {"lookup": {"ok": True}},
    "pending": None,
}
STEP = "refund"

SEED6_CHECKPOINT = """\
BEGIN;
SELECT revision AS rev FROM agent_runs WHERE run_id = :run_id AND owner = :owner AND epoch = :epoch AND lease_expires_at > clock_timestamp() FOR UPDATE \\gset
UPDATE agent_runs SET revision = revision + 1, current_step = :step, checkpoint_schema_version = 2, updated_at = clock_timestamp() WHERE run_id = :run_id AND revision = :rev RETURNING revision AS newrev \\gset
INSERT INTO agent_checkpoints (run_id, revision, tenant_id, epoch, owner, transition, state_json, state_hash, schema_version, event_id) VALUES (:run_id, :newrev, :tenant, :epoch, :owner, 'checkpoint', :state, :state_hash, 2, gen_random_uuid()) RETURNING event_id AS eid \\gset
INSERT INTO outbox (event_id, tenant_id, run_id, event_type, payload) VALUES (:eid, :tenant, :run_id, 'agent.checkpoint', :payload);
COMMIT;
"""

SEED7_CHECKPOINT = """\
BEGIN;
SELECT owner, epoch, lease_expires_at, revision FROM agent_runs WHERE run_id = :run_id FOR UPDATE;
SELECT revision AS rev FROM agent_runs WHERE run_id = :run_id AND owner = :owner AND epoch = :epoch AND lease_expires_at > clock_timestamp() \\gset
UPDATE agent_runs SET revision = revision + 1, current_step = :step, checkpoint_schema_version = 2, updated_at = clock_timestamp() WHERE run_id = :run_id AND revision = :rev RETURNING revision AS newrev \\gset
INSERT INTO agent_checkpoints (run_id, revision, tenant_id, epoch, owner, transition, state_json, state_hash, schema_version, event_id) VALUES (:run_id, :newrev, :tenant, :epoch, :owner, 'checkpoint', :state, :state_hash, 2, gen_random_uuid()) RETURNING event_id AS eid \\gset
INSERT INTO outbox (event_id, tenant_id, run_id, event_type, payload) VALUES (:eid, :tenant, :run_id, 'agent.checkpoint', :payload);
COMMIT;
"""

SEED_ROLE_SQL = f"""
CREATE ROLE {SEED_ROLE} LOGIN;
CREATE ROLE {WORKER_ROLE} LOGIN IN ROLE fencecheck_worker;
CREATE ROLE {OPERATOR_ROLE} LOGIN IN ROLE fencecheck_operator;
INSERT INTO public.tenant_bindings (role_name, tenant_id)
VALUES ('{SEED_ROLE}', '{TENANT}'), ('{WORKER_ROLE}', '{TENANT}'), ('{OPERATOR_ROLE}', '{TENANT}');
GRANT SELECT, UPDATE ON public.agent_runs TO {SEED_ROLE};
GRANT SELECT, INSERT ON public.agent_checkpoints, public.outbox TO {SEED_ROLE};
-- The policies call it as the querying role.
GRANT USAGE ON SCHEMA fencecheck TO {SEED_ROLE};
GRANT EXECUTE ON FUNCTION fencecheck.session_tenant() TO {SEED_ROLE};
"""

# The seed's statements (same checks, same row lock) in ONE plain PL/pgSQL
# call: what a one-round-trip version of the seed costs at best. Only in the
# benchmark's database; runs as its caller (fencecheck_bench, under RLS).
IDEAL_SQL = f"""
CREATE FUNCTION public.bench_seed_in_one(p_run uuid, p_owner text, p_epoch bigint,
  p_tenant uuid, p_step text, p_state jsonb, p_hash bytea, p_payload jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_rev bigint;
  v_new bigint;
  v_event uuid;
BEGIN
  PERFORM 1 FROM agent_runs WHERE run_id = p_run FOR UPDATE;
  SELECT revision INTO STRICT v_rev FROM agent_runs
   WHERE run_id = p_run AND owner = p_owner AND epoch = p_epoch
     AND lease_expires_at > clock_timestamp();
  UPDATE agent_runs SET revision = revision + 1, current_step = p_step,
         checkpoint_schema_version = 2, updated_at = clock_timestamp()
   WHERE run_id = p_run AND revision = v_rev RETURNING revision INTO STRICT v_new;
  INSERT INTO agent_checkpoints (run_id, revision, tenant_id, epoch, owner, transition,
                                 state_json, state_hash, schema_version, event_id)
  VALUES (p_run, v_new, p_tenant, p_epoch, p_owner, 'checkpoint', p_state, p_hash, 2,
          gen_random_uuid())
  RETURNING event_id INTO v_event;
  INSERT INTO outbox (event_id, tenant_id, run_id, event_type, payload)
  VALUES (v_event, p_tenant, p_run, 'agent.checkpoint', p_payload);
  RETURN v_new;
END
$$;
REVOKE ALL ON FUNCTION public.bench_seed_in_one FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.bench_seed_in_one TO {SEED_ROLE};
"""
IDEAL_CHECKPOINT = (
    "SELECT bench_seed_in_one(:run_id, :owner, :epoch, :tenant, :step, :state, :state_hash,"
    " :payload);\n"
)

# A queue of n due runs for one tenant, in one statement (untimed).
QUEUE_SQL = """
WITH ids AS (SELECT i, gen_random_uuid() AS run_id FROM generate_series(1, %(n)s) AS i),
     tasks AS (INSERT INTO public.agent_tasks (tenant_id, task_id, active_run_id)
               SELECT %(tenant)s, 'q-' || i, run_id FROM ids RETURNING 1)
INSERT INTO public.agent_runs (run_id, tenant_id, task_id)
SELECT run_id, %(tenant)s, 'q-' || i FROM ids
"""


class BenchError(RuntimeError):
    """The benchmark could not measure what it claims to measure."""


def pgbench_sql(statement: str, **literal: str) -> str:
    """A psycopg named-parameter statement as one pgbench script command.

    ``literal`` replaces a parameter by SQL text (``event_id="gen_random_uuid()"``).
    """
    for name, text in literal.items():
        if f"%({name})s" not in statement:
            raise BenchError(f"the statement has no parameter {name}")
        statement = statement.replace(f"%({name})s", text)
    return re.sub(r"%\((\w+)\)s", r":\1", statement).rstrip().rstrip(";") + ";\n"


def protected_write_script(statement: str) -> str:
    """The implementation's fast protected-write statement, carrying the revision on (\\gset)."""
    text = pgbench_sql(statement, event_id="gen_random_uuid()", effect="NULL")
    if not text.startswith("SELECT revision,"):
        raise BenchError("the protected_write statement no longer starts with SELECT revision")
    text = "SELECT revision AS expected_revision," + text[len("SELECT revision,") :]
    return text.rstrip().rstrip(";") + " \\gset\n"


def run_pgbench(argv: list[str], env: dict[str, str], n: int) -> Measure:
    """Run pgbench for exactly ``n`` transactions; its rate without connection time."""
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    done = re.search(r"number of transactions actually processed: (\d+)", out)
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if proc.returncode != 0 or done is None or tps is None or int(done.group(1)) != n:
        raise BenchError(f"pgbench failed (exit {proc.returncode}):\n{out.strip()}")
    return Measure(n, n / float(tps.group(1)))


@dataclass
class Measure:
    """One timed side: transactions, seconds (no connection time), client CPU."""

    transactions: int
    seconds: float
    cpu_seconds: float | None = None

    @property
    def rate(self) -> float:
        return self.transactions / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class Result:
    op: str
    transactions: int
    rates: dict[str, list[float]] = field(default_factory=dict)
    impl_cpu_us: list[float] = field(default_factory=list)

    def median(self, side: str) -> float:
        return statistics.median(self.rates[side])

    @property
    def baseline(self) -> str:
        return SIDES[self.op][0]

    @property
    def ratio(self) -> float:
        return self.median("impl") / self.median(self.baseline)

    @property
    def met(self) -> bool:
        return self.ratio >= TARGETS[self.op]


class Bench:
    """One migrated database, its leases and queues, and every side of every operation."""

    def __init__(self, binaries: PgBinaries, cluster: PostgresCluster, db: Database, work: Path):
        self.binaries = binaries
        self.cluster = cluster
        self.db = db
        self.work = work
        self.protocol = Protocol()
        self.q = self.protocol.queries
        self.leases: Leases = self.protocol.leases_cls(self.q)
        self.session = Session(ConnectionSpec(db.dsn(WORKER_ROLE), TENANT, "bench-impl"))
        self.control = Session(ConnectionSpec(db.dsn(OPERATOR_ROLE), TENANT, "bench-control"))
        self.roles = {TENANT: WORKER_ROLE}
        self.writer: ProtectedWriter = self.protocol.writer_cls(self.session, self.q)
        if self.writer.stepped:
            raise BenchError("the protected writer is in its stepped (harness) shape")
        self.runs = self.protocol.runs_cls(self.q, self.protocol.decode_checkpoint)
        self._queues = 0
        self.cp_lease = self._leased_run("bench-checkpoint")
        self.renew_lease = self._leased_run("bench-renew")
        self.scripts = {
            "seed6": self._script("seed6", SEED6_CHECKPOINT),
            "seed7": self._script("seed7", SEED7_CHECKPOINT),
            "ideal": self._script("ideal", IDEAL_CHECKPOINT),
            "stmt": self._script(
                "stmt", protected_write_script(self.q.sql("protected_write_fast"))
            ),
            "renew": self._script("renew", pgbench_sql(self.q.sql("renew"))),
            "claim": self._script("claim", pgbench_sql(self.q.sql("claim"))),
            "select1": self._script("select1", "SELECT 1;\n"),
        }

    # ------------------------------------------------------------ setup
    def _leased_run(self, task: str) -> Lease:
        conn = self.session.conn
        run_id = uuid.UUID(self.runs.create(self.control.conn, task, {})["run_id"])
        grant = self.leases.takeover(conn, run_id, f"bench/{task}", TTL_MS)
        if not grant.acquired:
            raise BenchError(f"could not lease {task}: {grant.outcome}")
        return grant.lease

    def _script(self, name: str, text: str) -> Path:
        path = self.work / f"{name}.pgbench"
        path.write_text(text)
        return path

    def new_queue(self, n: int) -> str:
        """A fresh tenant with exactly ``n`` due queued runs; returns the tenant."""
        self._queues += 1
        tenant = str(uuid.UUID(int=(0xB1 << 120) | self._queues))
        role = f"fencecheck_bench_q{self._queues}"
        with self.cluster.connect(self.db.name) as conn:
            conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE fencecheck_worker".encode())
            conn.execute(
                "INSERT INTO public.tenant_bindings (role_name, tenant_id) VALUES (%s, %s)",
                [role, tenant],
            )
            conn.execute("INSERT INTO public.tenants (tenant_id) VALUES (%s)", [tenant])
            conn.execute(QUEUE_SQL, {"n": n, "tenant": tenant})
        self.roles[tenant] = role
        return tenant

    def vacuum(self) -> None:
        """Each side starts without the dead row versions the previous side left."""
        with self.cluster.connect(self.db.name) as conn:
            conn.execute("VACUUM (ANALYZE) public.agent_runs")

    # ------------------------------------------------------------ pgbench
    def pgbench(
        self, script: str, n: int, *, user: str, tenant: str, variables: dict[str, str]
    ) -> Measure:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        if self.roles.get(tenant, user) != user and user != SEED_ROLE:
            raise BenchError(f"{user} is not bound to tenant {tenant}")
        argv = [
            self.binaries.path("pgbench"),
            *("-h", "127.0.0.1", "-p", str(self.cluster.port), "-U", user),
            *("-n", "-c", "1", "-j", "1", "-M", "prepared", "-t", str(n)),
            *("-f", str(self.scripts[script])),
        ]
        for key, value in variables.items():
            argv += ["-D", f"{key}={value}"]
        argv.append(self.db.name)
        return run_pgbench(argv, env, n)

    def round_trip_us(self, n: int = 2000) -> float:
        """One loopback round trip as pgbench sees it (SELECT 1, prepared)."""
        return 1e6 / self.pgbench("select1", n, user=WORKER_ROLE, tenant=TENANT, variables={}).rate

    # ------------------------------------------------------------ operations
    def checkpoint(self, side: str, n: int) -> Measure:
        lease = self.cp_lease
        payload = {"tenant_id": TENANT, "run_id": str(lease.run_id)}
        common = {
            "run_id": str(lease.run_id),
            "owner": lease.owner,
            "epoch": str(lease.epoch),
            "state": canonical_json(STATE),
            "state_hash": "\\x" + state_hash(STATE).hex(),
            "payload": canonical_json(payload),
        }
        if side in ("seed6", "seed7", "ideal"):
            variables = {**common, "tenant": TENANT, "step": STEP}
            return self.pgbench(side, n, user=SEED_ROLE, tenant=TENANT, variables=variables)
        rev = self._run_row(lease.run_id)["revision"]
        if side == "stmt":
            variables = {
                **common,
                "expected_revision": str(rev),
                "transition": "checkpoint",
                "schema_version": "2",
                "current_step": STEP,
                "event_type": "agent.checkpoint",
            }
            return self.pgbench("stmt", n, user=WORKER_ROLE, tenant=TENANT, variables=variables)
        writer = self.writer
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            w = Write(lease, rev, "checkpoint", STATE, 2, "agent.checkpoint", payload, STEP)
            rev = writer.write(w).revision
        return Measure(n, time.perf_counter() - t0, time.process_time() - c0)

    def renew(self, side: str, n: int) -> Measure:
        lease = self.renew_lease
        if side == "pgbench":
            before = self._run_row(lease.run_id)["lease_expires_at"]
            variables = {
                "run_id": str(lease.run_id),
                "owner": lease.owner,
                "epoch": str(lease.epoch),
                "ttl_ms": str(TTL_MS),
            }
            m = self.pgbench("renew", n, user=WORKER_ROLE, tenant=TENANT, variables=variables)
            if not self._run_row(lease.run_id)["lease_expires_at"] > before:
                raise BenchError("pgbench's renewals did not extend the lease")
            return m
        conn, leases = self.session.conn, self.leases
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            if not leases.renew(conn, lease, TTL_MS).ok:
                raise BenchError("a renewal was refused")
        return Measure(n, time.perf_counter() - t0, time.process_time() - c0)

    def claim(self, side: str, n: int, tenant: str) -> Measure:
        owner = f"bench-{side}/{tenant[-4:]}"
        if side == "pgbench":
            variables = {"owner": owner, "ttl_ms": str(TTL_MS)}
            m = self.pgbench(
                "claim", n, user=self.roles[tenant], tenant=tenant, variables=variables
            )
        else:
            spec = ConnectionSpec(self.db.dsn(self.roles[tenant]), tenant, "bench-impl-claim")
            conn, _ = connect(spec)
            try:
                leases = self.leases
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(n):
                    if not leases.claim(conn, owner, TTL_MS).acquired:
                        raise BenchError("a claim found nothing to claim")
                m = Measure(n, time.perf_counter() - t0, time.process_time() - c0)
            finally:
                conn.close()
        row = self.db.query(
            "SELECT count(*) FILTER (WHERE owner = %(owner)s AND status = 'running') AS claimed,"
            " count(*) FILTER (WHERE status = 'queued') AS queued"
            " FROM public.agent_runs WHERE tenant_id = %(tenant)s",
            {"owner": owner, "tenant": tenant},
        )[0]
        if (row["claimed"], row["queued"]) != (n, 0):
            raise BenchError(f"{side}: expected {n} claims and an empty queue, found {row}")
        return m

    def _run_row(self, run_id: uuid.UUID) -> dict[str, Any]:
        row = self.session.conn.execute(self.q.sql("run_state"), {"run_id": run_id}).fetchone()
        if row is None:
            raise BenchError(f"run {run_id} vanished")
        return row

    # ------------------------------------------------------------ driver
    def side(self, op: str, side: str, n: int, queues: dict[str, str]) -> Measure:
        self.vacuum()
        if op == "checkpoint":
            return self.checkpoint(side, n)
        if op == "renew":
            return self.renew(side, n)
        return self.claim(side, n, queues[side])

    def queues(self, op: str, n: int) -> dict[str, str]:
        return {s: self.new_queue(n) for s in SIDES[op]} if op == "claim" else {}

    def measure(self, op: str, seconds: float, rounds: int, say: Callable[[str], None]) -> Result:
        sides = SIDES[op]
        # Untimed warm-up; its rates say how many transactions take ``seconds``.
        queues = self.queues(op, WARMUP)
        warm = [self.side(op, s, WARMUP, queues).rate for s in sides]
        n = max(MIN_TRANSACTIONS, round(len(sides) * seconds / sum(1 / r for r in warm)))
        say(f"\n{op}: {n} transactions per side per round, one connection each")
        result = Result(op, n, {s: [] for s in sides})
        round_trips: list[float] = []
        for r in range(1, rounds + 1):
            queues = self.queues(op, n)
            if op == "checkpoint":
                round_trips.append(self.round_trip_us())
            # ABBA: even rounds run the sides in reverse, so a drift in the
            # machine's load does not always favour the same side.
            for s in sides if r % 2 else reversed(sides):
                m = self.side(op, s, n, queues)
                result.rates[s].append(m.rate)
                if m.cpu_seconds is not None:
                    result.impl_cpu_us.append(1e6 * m.cpu_seconds / n)
            cells = [f"{s} {result.rates[s][-1]:7.0f}/s" for s in sides]
            base, impl = result.rates[sides[0]][-1], result.rates["impl"][-1]
            say(f"  round {r}: {'   '.join(cells)}   impl/{sides[0]} {impl / base:.2f}x")
        for s in sides:
            say(
                f"  median {LABELS[s]:<29} {result.median(s):7.0f}/s {1e6 / result.median(s):5.0f}us"
            )
        us = {s: 1e6 / result.median(s) for s in sides}
        same_sql = "stmt" if op == "checkpoint" else "pgbench"
        say(
            f"  impl vs pgbench running the same statement: {us['impl'] - us[same_sql]:+.0f} us"
            " per transaction (Python + psycopg); impl process CPU"
            f" {statistics.median(result.impl_cpu_us):.0f} us per transaction"
        )
        if round_trips:
            say(
                f"  breakdown: a bare round trip (pgbench SELECT 1) takes"
                f" {statistics.median(round_trips):.0f} us; seed7's statements in one call"
                f" run {us['seed7'] / us['ideal']:.2f}x seed7 (what cutting round trips alone"
                f" gives here); the implementation's function takes {us['stmt'] - us['ideal']:+.0f}"
                " us against those plain statements"
            )
        also = ""
        if op == "checkpoint":
            also = f"; impl/seed7 {result.median('impl') / result.median('seed7'):.2f}x"
            # No client can beat pgbench running the same statement: its rate
            # over the baseline is the most cutting round trips can give here.
            say(
                f"  ceiling: pgbench running the implementation's statement reaches"
                f" {result.median('stmt') / result.median('seed6'):.2f}x seed6; the implementation"
                f" keeps {result.median('impl') / result.median('stmt'):.0%} of that rate"
            )
        say(
            f"  ratio impl/{result.baseline} {result.ratio:.2f}x"
            f" (target >= {TARGETS[op]:.1f}x: {'met' if result.met else 'NOT met'}){also}"
        )
        return result

    def close(self) -> None:
        self.session.close()
        self.control.close()


def _say(line: str) -> None:
    print(line, flush=True)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reference_impl.bench",
        description="Throughput of the reference implementation vs pgbench doing the same"
        " work: figures and ratios, no assertion.",
    )
    p.add_argument("--seconds", type=float, default=1.2, help="about this long per side per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds per operation (sides alternate)")
    p.add_argument(
        "--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}"
    )
    p.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default="on",
        help="of the benchmark database, both sides (default on, as the harness runs);"
        " off takes the WAL flush out of every commit",
    )
    p.add_argument("--pg-bin", help="PostgreSQL bin directory (default: the harness search order)")
    return p


def run(args: argparse.Namespace, say: Callable[[str], None] = _say) -> list[Result]:
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown or not ops:
        raise BenchError(f"unknown operation(s) {unknown}; choose from {', '.join(OPS)}")
    if args.seconds <= 0 or args.rounds < 1:
        raise BenchError("--seconds must be > 0 and --rounds >= 1")
    if injection.active():
        raise BenchError("FENCECHECK_CONTROL is set: unset it to measure the fast path")
    binaries = find_pg_binaries(args.pg_bin)
    if not os.access(binaries.path("pgbench"), os.X_OK):
        raise BenchError(f"no pgbench next to the server in {binaries.bindir}")
    work = Path(tempfile.mkdtemp(prefix="fencecheck-bench-"))
    cluster: PostgresCluster | None = None
    bench: Bench | None = None
    try:
        say(f"fencecheck bench: {binaries.describe()}; work dir {work}")
        cluster = PostgresCluster.init_primary(binaries, work / "pg", name="bench")
        db = cluster.create_database(prefix="bench")
        migrate(db.admin_dsn)
        with cluster.connect(db.name) as conn:
            conn.execute(SEED_ROLE_SQL)
            conn.execute(IDEAL_SQL)
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}").format(
                    sql.Identifier(db.name), sql.Literal(args.synchronous_commit)
                )
            )
        bench = Bench(binaries, cluster, db, work)
        facts = db.query(
            "SELECT current_setting('synchronous_commit') AS sc, current_setting('fsync') AS fs"
        )[0]
        say(
            f"  synchronous_commit={facts['sc']} fsync={facts['fs']}; pgbench -n -c 1 -j 1"
            f" -M prepared -t N; seed as {SEED_ROLE} (DML grants, same RLS), everything"
            f" else as {WORKER_ROLE}"
        )
        results = [bench.measure(op, args.seconds, args.rounds, say) for op in ops]
        say("\nsummary (medians):")
        for r in results:
            say(
                f"  ratio {r.op:<10} impl/{r.baseline:<7} {r.ratio:5.2f}x"
                f"  target >= {TARGETS[r.op]:.1f}x  {'met' if r.met else 'NOT met'}"
                f"  ({r.baseline} {r.median(r.baseline):.0f}/s, impl {r.median('impl'):.0f}/s)"
            )
        return results
    finally:
        if bench is not None:
            bench.close()
        if cluster is not None:
            cluster.remove()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        run(args)
    except KeyboardInterrupt:
        print("bench: interrupted; cluster and temp files removed", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())

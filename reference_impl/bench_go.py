"""``python -m reference_impl.bench_go``: the Go worker vs pgbench running its statements.

Prints figures and ratios; asserts nothing about speed (``make go-bench``).
One run starts its own throw-away PostgreSQL cluster with the harness's
binaries (``pgbench`` from the same bin directory), migrates one database
with the Go binary's own ``migrate``, and for each operation runs
``--rounds`` rounds of [pgbench, Go] (even rounds in reverse order), each
side doing ``-n`` operations of the same work on one connection as the
worker role, connection time excluded on both sides:

checkpoint
    pgbench runs the Go worker's own seven statements of one protected
    checkpoint (``fencecheck-go-worker bench-scripts``: BEGIN; lock; validate;
    CAS; checkpoint row; outbox row; COMMIT), carrying the revision with
    ``\\gset``; Go runs ``Writer.Write`` (the same statements, plus what Go
    does around them: validating, canonical JSON, hashing, a fresh event id).
    Both on the same run under the same lease (TTL one day).
renew
    the ``Renew`` statement, same lease.
claim
    the ``ClaimRun`` statement; each side claims from a fresh queue (its own
    tenant) of exactly as many due runs as it claims; every claim must be
    granted.

Go's side is ``fencecheck-go-worker bench OP N`` (an untimed warm-up first,
except for claim). The ratio is Go / pgbench; 1.0 means the Go code adds
nothing to the server's work and the round trips. Everything started is
stopped and removed at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.parts.pg_binaries import find_pg_binaries
from harness.parts.postgres import Database, PostgresCluster
from reference_impl.bench import BenchError, Measure, run_pgbench

WORKER_ROLE = "fencecheck_worker"
TENANT = "b0000000-0000-0000-0000-000000000001"
OPS = ("checkpoint", "renew", "claim")

LEASE_SQL = """
INSERT INTO tenants (tenant_id) VALUES (%(tenant)s) ON CONFLICT DO NOTHING;
INSERT INTO agent_tasks (tenant_id, task_id, active_run_id) VALUES (%(tenant)s, %(task)s, %(run)s);
INSERT INTO agent_runs (run_id, tenant_id, task_id, status, owner, epoch, lease_expires_at)
VALUES (%(run)s, %(tenant)s, %(task)s, 'running', %(owner)s, 1, clock_timestamp() + interval '1 day');
"""

QUEUE_SQL = """
INSERT INTO tenants (tenant_id) VALUES (%(tenant)s);
INSERT INTO agent_tasks (tenant_id, task_id)
SELECT %(tenant)s, 'q-' || g FROM generate_series(1, %(n)s) g;
INSERT INTO agent_runs (run_id, tenant_id, task_id)
SELECT gen_random_uuid(), %(tenant)s, 'q-' || g FROM generate_series(1, %(n)s) g;
"""


class GoBench:
    def __init__(self, worker: str, cluster: PostgresCluster, db: Database, work: Path) -> None:
        self.worker = worker
        self.cluster = cluster
        self.db = db
        self.work = work
        self.binaries = cluster.binaries
        scripts = json.loads(self._go("bench-scripts", env={}).stdout)
        self.scripts = {}
        for name, text in scripts.items():
            path = work / f"{name}.pgbench"
            path.write_text(text)
            self.scripts[name] = path
        self.queues = 0
        self.lease = {"run_id": str(uuid.uuid4()), "owner": "bench/go", "epoch": "1"}
        params = {
            "tenant": TENANT,
            "task": "bench",
            "run": self.lease["run_id"],
            "owner": "bench/go",
        }
        self._execute(LEASE_SQL, params)

    def _execute(self, script: str, params: Mapping[str, object]) -> None:
        """Run a few statements as superuser (one at a time: they carry parameters)."""
        with self.cluster.connect(self.db.name) as conn, conn.transaction():
            for statement in filter(str.strip, script.split(";\n")):
                conn.execute(statement.encode(), params)

    def _go(self, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.worker, *args],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("FENCECHECK_")}, **env},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            raise BenchError(
                f"`{self.worker} {' '.join(args)}` exited {proc.returncode}: {proc.stderr}"
            )
        return proc

    def new_queue(self, n: int) -> str:
        self.queues += 1
        tenant = str(uuid.UUID(int=(0xB2 << 120) | self.queues))
        self._execute(QUEUE_SQL, {"tenant": tenant, "n": n})
        return tenant

    def vacuum(self) -> None:
        with self.cluster.connect(self.db.name) as conn:
            conn.execute("VACUUM (ANALYZE) agent_runs")

    def go(self, op: str, n: int, tenant: str) -> Measure:
        env = {
            "FENCECHECK_DSN": self.db.dsn(WORKER_ROLE),
            "FENCECHECK_TENANT": tenant,
            "FENCECHECK_WORKER_ID": "bench-go",
        }
        args = ["bench", op, str(n)]
        if op != "claim":
            args += [
                "--run-id",
                self.lease["run_id"],
                "--owner",
                self.lease["owner"],
                "--epoch",
                self.lease["epoch"],
            ]
        out = json.loads(self._go(*args, env=env).stdout)
        return Measure(n, float(out["seconds"]))

    def pgbench(self, op: str, n: int, tenant: str) -> Measure:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["PGOPTIONS"] = f"-c app.tenant_id={tenant}"
        argv = [
            self.binaries.path("pgbench"),
            *("-h", "127.0.0.1", "-p", str(self.cluster.port), "-U", WORKER_ROLE),
            *("-n", "-c", "1", "-j", "1", "-M", "prepared", "-t", str(n)),
            *("-f", str(self.scripts[op])),
        ]
        variables = dict(self.lease) if op != "claim" else {"owner": "bench/pgbench"}
        for key, value in variables.items():
            argv += ["-D", f"{key}={value}"]
        argv.append(self.db.name)
        return run_pgbench(argv, env, n)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reference_impl.bench_go", description=__doc__)
    p.add_argument("--worker", required=True, help="the Go worker binary")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("-n", type=int, default=2000, help="operations per side and round")
    p.add_argument("--ops", nargs="*", default=list(OPS), choices=OPS)
    args = p.parse_args(argv)
    binaries = find_pg_binaries()
    root = Path(tempfile.mkdtemp(prefix="fencecheck-gobench-"))
    cluster: PostgresCluster | None = None
    try:
        cluster = PostgresCluster.init_primary(binaries, root / "pg", name="gobench")
        db = cluster.create_database(prefix="gobench")
        migrate = subprocess.run(
            [args.worker, "migrate"],
            env={**os.environ, "FENCECHECK_ADMIN_DSN": db.admin_dsn},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if migrate.returncode != 0:
            raise BenchError(f"migrate failed: {migrate.stderr}")
        bench = GoBench(args.worker, cluster, db, root)
        print(
            f"Go worker vs pgbench running its statements; {binaries.describe()}; "
            f"{args.rounds} round(s) of {args.n} per side; load {os.getloadavg()[0]:.1f}"
        )
        for op in args.ops:
            rates: dict[str, list[float]] = {"pgbench": [], "go": []}
            for r in range(args.rounds):
                order = ("pgbench", "go") if r % 2 == 0 else ("go", "pgbench")
                for side in order:
                    bench.vacuum()
                    tenant = bench.new_queue(args.n) if op == "claim" else TENANT
                    m = (
                        bench.pgbench(op, args.n, tenant)
                        if side == "pgbench"
                        else bench.go(op, args.n, tenant)
                    )
                    rates[side].append(m.rate)
            pg, go = statistics.median(rates["pgbench"]), statistics.median(rates["go"])
            print(
                f"  {op:10s} pgbench {pg:8.0f}/s ({1e6 / pg:6.0f} us)   go {go:8.0f}/s "
                f"({1e6 / go:6.0f} us)   go/pgbench {go / pg:.2f}x   rounds go/pg: "
                + ", ".join(
                    f"{g / q:.2f}" for g, q in zip(rates["go"], rates["pgbench"], strict=True)
                )
            )
        print(f"  load at the end {os.getloadavg()[0]:.1f}")
    except BenchError as exc:
        print(f"bench_go: {exc}", file=sys.stderr)
        return 2
    finally:
        if cluster is not None:
            cluster.remove()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Environment timings, printed (not asserted): how long the real parts take to come up.

    python -m harness.engine.bench_env [--rounds N]

Measures, as medians over N rounds in one run: primary start (initdb +
start), a fresh database from a template, primary + streaming standby in
async mode and in sync mode (standby through a toxiproxy link), and a
failover (fence + promote).
"""

from __future__ import annotations

import argparse
import statistics
import time

from harness.engine.run_records import RunRecord
from harness.parts.pg_binaries import find_pg_binaries
from harness.parts.postgres import PostgresCluster, failover
from harness.parts.processes import ProcessRegistry
from harness.parts.toxiproxy import ToxiproxyServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.engine.bench_env")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    binaries = find_pg_binaries()
    # A run record, so a bench killed half-way is reaped like any run.
    record = RunRecord.create(base=None, kind="bench")
    root = record.temp_root
    figures: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        figures.setdefault(name, []).append(seconds)

    try:
        with (
            ProcessRegistry() as registry,
            ToxiproxyServer(root / "logs", registry=registry) as toxi,
        ):
            for i in range(args.rounds):
                for mode in ("async", "sync"):
                    base = root / f"r{i}{mode}"
                    clusters: list[PostgresCluster] = []
                    try:
                        started = time.monotonic()
                        primary = PostgresCluster.init_primary(binaries, base, name="primary")
                        clusters.append(primary)
                        add("primary start (initdb + start)", time.monotonic() - started)
                        template = primary.create_template("t", lambda _dsn: None)
                        started_db = time.monotonic()
                        primary.create_database(template=template)
                        add("database from template", time.monotonic() - started_db)
                        link = toxi.link(f"repl_{i}_{mode}", f"127.0.0.1:{primary.port}")
                        standby = primary.create_standby(
                            base, upstream_host=link.listen_host, upstream_port=link.listen_port
                        )
                        clusters.append(standby)
                        primary.wait_streaming("replica")
                        if mode == "sync":
                            primary.set_sync_standby("replica")
                        add(f"primary + standby streaming ({mode})", time.monotonic() - started)
                        moved = failover(primary, standby)
                        add(
                            "failover (fence + promote)",
                            moved.fence_seconds + moved.promote_seconds,
                        )
                        toxi.remove_link(link.name)
                    finally:
                        for c in clusters:
                            c.remove()
    finally:
        record.release()
    print(f"environment timings, median of {args.rounds} round(s), {binaries.describe()}:")
    for name, values in figures.items():
        print(
            f"  {statistics.median(values):6.3f}s  {name}   (all: "
            + ", ".join(f"{v:.3f}" for v in values)
            + ")"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

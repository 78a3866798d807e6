"""``python -m reference_impl.worker {migrate,run,ops,mutants,write-paths,mapping,fork-server}`` (worker contract, section 1)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import psycopg

from reference_impl import logs, metrics
from reference_impl.config import Settings, from_env
from reference_impl.errors import ProtocolError
from reference_impl.migrations import migrate
from reference_impl.protocol import load_protocol

_log = logging.getLogger("reference_impl.worker")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fencecheck-worker", description=__doc__)
    p.add_argument(
        "mode",
        choices=["migrate", "run", "ops", "mutants", "write-paths", "mapping", "fork-server"],
    )
    p.add_argument("--dsn", help="worker-role DSN (FENCECHECK_DSN)")
    p.add_argument("--admin-dsn", help="superuser DSN for migrate (FENCECHECK_ADMIN_DSN)")
    p.add_argument("--worker-id", help="FENCECHECK_WORKER_ID")
    p.add_argument("--tenant", help="tenant uuid (FENCECHECK_TENANT)")
    p.add_argument("--tool-url", help="FENCECHECK_TOOL_URL")
    p.add_argument("--broker-url", help="FENCECHECK_BROKER_URL")
    p.add_argument("--lease-ttl-ms", type=int, help="FENCECHECK_LEASE_TTL_MS")
    p.add_argument("--heartbeat-ms", type=int, help="FENCECHECK_HEARTBEAT_MS")
    p.add_argument("--heartbeat-timeout-ms", type=int, help="FENCECHECK_HEARTBEAT_TIMEOUT_MS")
    p.add_argument("--dispatch-ttl-ms", type=int, help="FENCECHECK_DISPATCH_TTL_MS")
    p.add_argument("--metrics-port", type=int, help="FENCECHECK_METRICS_PORT")
    p.add_argument(
        "--require-durability",
        choices=["none", "async", "sync"],
        help="run: refuse to start (exit 13) below this mode (FENCECHECK_REQUIRE_DURABILITY)",
    )
    p.add_argument("--run-id", help="run: only this run (targeted takeover, waits on the lock)")
    p.add_argument("--once", action="store_true", help="run: exit after one run")
    p.add_argument("--exit-when-idle", action="store_true", help="run: exit 0 when idle")
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    return from_env(
        dsn=args.dsn,
        admin_dsn=args.admin_dsn,
        worker_id=args.worker_id,
        tenant=args.tenant,
        tool_url=args.tool_url,
        broker_url=args.broker_url,
        lease_ttl_ms=args.lease_ttl_ms,
        heartbeat_ms=args.heartbeat_ms,
        heartbeat_timeout_ms=args.heartbeat_timeout_ms,
        dispatch_ttl_ms=args.dispatch_ttl_ms,
        metrics_port=args.metrics_port,
        require_durability=args.require_durability,
    )


def print_mutants() -> int:
    """The mutant registry as JSON (reference worker only): the harness reads it
    from this process and never imports reference_impl."""
    from reference_impl.mutants import REGISTRY

    json.dump([m.as_dict() for m in REGISTRY.values()], sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


MAPPING_FILE = Path(__file__).parent / "fencecheck-mapping.yaml"

# The protected write's two shapes, by a text each one's top-level statement
# contains (worker contract §1, ``write-paths``): the harness's audit trigger
# records that statement, so it sees which path every write took.
WRITE_PATHS = {
    "fast": "fencecheck.protected_write_fast(",
    "stepped": "fencecheck.protected_write(",
}


def warm_imports() -> None:
    """What every worker mode imports, loaded once by a fork server so a forked
    worker starts with all of it; building the protocol once proves the
    statements load before the first child needs them."""
    import reference_impl.mutants
    import reference_impl.ops
    import reference_impl.runner
    import reference_impl.runtime  # noqa: F401

    load_protocol(None)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.mode == "fork-server":
        from reference_impl import fork_server

        return fork_server.serve(main, warm_imports)
    if args.mode == "mutants":
        return print_mutants()
    if args.mode == "mapping":
        # The worker's own declaration (contract §14), kept beside its code.
        sys.stdout.write(MAPPING_FILE.read_text(encoding="utf-8"))
        return 0
    if args.mode == "write-paths":
        print(json.dumps(WRITE_PATHS))
        return 0
    try:
        settings = settings_from(args)
    except ValueError as exc:
        print(f"fencecheck-worker: {exc}", file=sys.stderr)
        return 1
    logs.setup(settings.worker_id)
    try:
        protocol = load_protocol(settings.mutant)
    except ProtocolError as exc:
        print(f"fencecheck-worker: {exc}", file=sys.stderr)
        return 1
    if args.mode == "migrate":
        if not settings.admin_dsn:
            print("fencecheck-worker: migrate needs FENCECHECK_ADMIN_DSN", file=sys.stderr)
            return 1
        try:
            applied = migrate(settings.admin_dsn, protocol.sql_overlays)
        except (psycopg.Error, ProtocolError, ValueError) as exc:
            print(f"fencecheck-worker: migrate failed: {exc}", file=sys.stderr)
            return 1
        logs.log(_log, logging.INFO, "migrated", applied=applied, protocol=protocol.name)
        return 0

    from reference_impl.runtime import Runtime

    try:
        rt = Runtime(settings, protocol)
    except ValueError as exc:
        print(f"fencecheck-worker: {exc}", file=sys.stderr)
        return 1
    if settings.metrics_port or settings.metrics_file:
        dsn = settings.dsn or ""
        metrics.watch_database(
            lambda: psycopg.connect(dsn, connect_timeout=2, options="-c statement_timeout=2000")
        )
    if settings.metrics_port:
        try:
            metrics.serve(settings.metrics_port)
        except OSError as exc:  # the port was taken meanwhile: still write the exit file
            logs.log(_log, logging.WARNING, "metrics port unavailable", error=str(exc))
    try:
        if args.mode == "ops":
            from reference_impl.ops import OpsServer

            return OpsServer(rt).serve()
        from reference_impl.runner import Runner

        stop = threading.Event()

        def on_term(signum: int, frame: FrameType | None) -> None:
            stop.set()  # stop claiming; the current short transaction finishes

        signal.signal(signal.SIGTERM, on_term)
        run_id = uuid.UUID(args.run_id) if args.run_id else None
        return Runner(rt, stop).run(run_id, once=args.once, exit_when_idle=args.exit_when_idle)
    except psycopg.OperationalError as exc:
        logs.log(_log, logging.ERROR, "database unavailable", error=str(exc))
        return 1
    except ProtocolError as exc:  # e.g. TenantBindingMismatch at the first connection
        logs.log(_log, logging.ERROR, "refused", error=type(exc).__name__, why=str(exc))
        print(f"fencecheck-worker: {exc}", file=sys.stderr)
        return 1
    finally:
        rt.close()
        if settings.metrics_file:
            try:
                metrics.write_snapshot(Path(settings.metrics_file))
            except OSError as exc:
                print(f"fencecheck-worker: metrics not written: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

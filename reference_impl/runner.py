"""``run`` mode: claim, execute under a heartbeat, repeat.

Exit codes (worker contract, section 1): 0 done, idle or paused for a
human, 10 execution cancelled (lease lost or renewal unconfirmed, or a
commit whose outcome or durability is unknown), 11 run frozen in doubt
(also after a commit read back inconsistent), 12 checkpoint schema refused,
13 the deployment does not meet the required durability mode, 1 anything
else.

At start, ``run`` logs the durability contract it works under (what an
acknowledged commit is worth here, English seed §10) and refuses to start
when it is below ``FENCECHECK_REQUIRE_DURABILITY``.

Invariants: a claim never treats "not acquired" as a task failure; an
execution whose heartbeat failed stops before its next step or side effect,
and if it is stuck in a database call (a cut link) the process exits with 10
after a grace period rather than wait forever; SIGTERM stops claiming,
lets the current short transaction finish, gives the lease back, exits 0.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid

import psycopg

from harness import injection
from reference_impl import errors as e
from reference_impl import history
from reference_impl.cancellation import Cancellation
from reference_impl.checkpoint_schema import CURRENT_VERSION
from reference_impl.durability import read_contract
from reference_impl.leases import Grant, Lease
from reference_impl.logs import log
from reference_impl.protected import Write
from reference_impl.runtime import Runtime
from reference_impl.workflow import Draining, RefundWorkflow

_log = logging.getLogger("reference_impl.runner")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CANCELLED = 10
EXIT_INDOUBT = 11
EXIT_SCHEMA = 12
EXIT_DURABILITY = 13
POLL_S = 0.2
_DURABILITY_RANK = {"none": 0, "async": 1, "sync": 2}


class Runner:
    def __init__(self, rt: Runtime, stop: threading.Event | None = None) -> None:
        self.rt = rt
        self.stop = stop or threading.Event()

    def run(
        self, run_id: uuid.UUID | None = None, once: bool = False, exit_when_idle: bool = False
    ) -> int:
        if not self.durability_ok():
            return EXIT_DURABILITY
        while not self.stop.is_set():
            grant = self.acquire(run_id)
            if grant is None:
                return EXIT_OK
            if not grant.acquired:
                if exit_when_idle and run_id is None:
                    return EXIT_OK
                self.stop.wait(POLL_S)
                continue
            injection.point(
                "after_lease_acquired",
                run_id=grant.run_id,
                epoch=grant.epoch,
                revision=grant.revision,
            )
            code = self.execute(grant)
            if once or run_id is not None or code != EXIT_OK:
                return code
        return EXIT_OK

    def durability_ok(self) -> bool:
        """Log the durability contract; False when it is below the required mode."""
        contract = read_contract(self.rt.conn, self.rt.protocol.queries)
        required = self.rt.settings.require_durability
        ok = required is None or _DURABILITY_RANK[contract.mode] >= _DURABILITY_RANK[required]
        log(
            _log,
            logging.INFO if ok else logging.CRITICAL,
            "durability contract" if ok else "durability contract below the required mode",
            mode=contract.mode,
            required=required,
            guarantee=contract.guarantee,
            settings=contract.settings,
        )
        return ok

    def acquire(self, run_id: uuid.UUID | None) -> Grant | None:
        """A grant (maybe not acquired: poll again), or None when there is nothing to wait for."""
        rt = self.rt
        # A claim that was not granted is recorded fail, as the ops claim's
        # refusal is: an ok claim says the lease is ours (contract section 4),
        # and this poll's epoch, when the run is held, is another holder's.
        try:
            with history.operation("claim", run_id=run_id) as h:
                if run_id is None:
                    grant = rt.leases.claim(rt.conn, rt.owner, rt.settings.lease_ttl_ms)
                else:
                    grant = rt.leases.takeover(rt.conn, run_id, rt.owner, rt.settings.lease_ttl_ms)
                h.ids.update(run_id=grant.run_id, epoch=grant.epoch, revision=grant.revision)
                h.detail.update(outcome=grant.outcome, owner=rt.owner)
                if not grant.acquired:
                    raise e.NotClaimable(f"not claimable: {grant.outcome}", reason=grant.outcome)
        except e.NotClaimable:
            pass  # polled again, or nothing to take over (below)
        if run_id is not None and grant.outcome in ("missing", "terminal", "paused"):
            log(
                _log,
                logging.INFO,
                "nothing to take over",
                run_id=str(run_id),
                outcome=grant.outcome,
            )
            return None
        return grant

    def execute(self, grant: Grant) -> int:
        rt = self.rt
        lease = grant.lease
        cancel = Cancellation()
        finished = threading.Event()
        hb = rt.heartbeat(lease, cancel).start()
        threading.Thread(
            target=self._watchdog, args=(cancel, finished, lease.run_id), daemon=True
        ).start()
        log(
            _log,
            logging.INFO,
            "lease acquired",
            run_id=str(lease.run_id),
            owner=lease.owner,
            epoch=lease.epoch,
            revision=grant.revision,
            status=grant.status,
        )
        release = False
        try:
            status = RefundWorkflow(rt, lease, cancel, self.stop).run()
            return EXIT_INDOUBT if status == "paused_indoubt" else EXIT_OK
        except Draining:
            release = True
            return EXIT_OK
        except (e.ExecutionCancelled, e.LeaseLost, e.CommitOutcomeUnknown) as exc:
            _log_stop(logging.WARNING, "execution stopped", lease, exc)
            return EXIT_CANCELLED
        except (e.SchemaVersionUnknown, e.CheckpointCorrupt) as exc:
            _log_stop(logging.ERROR, "checkpoint refused", lease, exc)
            release = True
            return EXIT_SCHEMA
        except e.CommitInconsistent as exc:
            _log_stop(
                logging.CRITICAL,
                "ALERT: commit read-back inconsistent; freezing the run in doubt",
                lease,
                exc,
            )
            self._freeze_inconsistent(lease, exc)
            return EXIT_INDOUBT
        except (e.ProtocolError, psycopg.Error) as exc:
            if cancel.cancelled:
                return EXIT_CANCELLED
            _log_stop(logging.ERROR, "execution failed", lease, exc)
            return EXIT_ERROR
        finally:
            finished.set()
            hb.stop()
            if release:
                self._release(grant)

    def _freeze_inconsistent(self, lease: Lease, exc: e.CommitInconsistent) -> None:
        """Rule 9, one row present: freeze the run (paused in doubt, the evidence in
        its outbox event) so no worker claims it until a person looked. Only
        while the lease is still ours; otherwise the lease runs out and the
        successor's own read of the run decides."""
        rt = self.rt
        try:
            row = rt.runs.state(rt.conn, lease.run_id)
            if row["owner"] != lease.owner or int(row["epoch"]) != lease.epoch:
                return
            latest = rt.conn.execute(
                rt.protocol.queries.sql("latest_checkpoint"), {"run_id": lease.run_id}
            ).fetchone()
            state = dict(latest["state_json"]) if latest else {}
            evidence = {"reason": "commit_inconsistent", "detail": str(exc)}
            rt.writer.write(
                Write(
                    lease,
                    int(row["revision"]),
                    "freeze",
                    state,
                    CURRENT_VERSION,
                    "agent.commit_inconsistent",
                    {"run_id": str(lease.run_id), "epoch": lease.epoch, **evidence},
                    current_step=row["current_step"],
                )
            )
        except (e.ProtocolError, psycopg.Error) as why:
            _log_stop(logging.CRITICAL, "ALERT: could not freeze the run", lease, why)

    def _release(self, grant: Grant) -> None:
        rt = self.rt
        try:
            with history.operation("release", run_id=grant.run_id, epoch=grant.epoch):
                outcome = rt.leases.release(rt.conn, grant.lease)
            log(
                _log,
                logging.INFO,
                "lease released",
                run_id=str(grant.run_id),
                epoch=grant.epoch,
                outcome=outcome,
            )
        except psycopg.Error as exc:
            log(
                _log,
                logging.WARNING,
                "release failed; the lease will expire",
                run_id=str(grant.run_id),
                error=repr(exc),
            )

    def _watchdog(self, cancel: Cancellation, finished: threading.Event, run_id: uuid.UUID) -> None:
        """If cancelled while stuck (e.g. in a call on a cut link), exit 10 after a grace."""
        s = self.rt.settings
        while not finished.is_set():
            if cancel.cancelled:
                grace = (s.heartbeat_timeout_ms + s.heartbeat_ms) / 1000.0 + 1.0
                if finished.wait(grace):
                    return
                injection.record(
                    "info",
                    "execution",
                    run_id=run_id,
                    error="ExecutionCancelled",
                    detail={"exit": EXIT_CANCELLED, "cause": cancel.cause},
                )
                log(
                    _log,
                    logging.ERROR,
                    "execution stuck after cancellation; exiting",
                    run_id=str(run_id),
                    cause=cancel.cause,
                )
                os._exit(EXIT_CANCELLED)
            finished.wait(0.05)


def _log_stop(level: int, msg: str, lease: Lease, exc: BaseException) -> None:
    """Why a run's execution ended, with the lease it ended under."""
    log(
        _log,
        level,
        msg,
        run_id=str(lease.run_id),
        owner=lease.owner,
        epoch=lease.epoch,
        error=type(exc).__name__,
        why=str(exc),
    )

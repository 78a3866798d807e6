"""Heartbeat (rule 8): renew on its own thread, own connection, own timeout.

Invariants:
- each renewal has its own bound: statement_timeout and connect_timeout on
  the heartbeat's own connection, and a client-side wait of the same length
  (a partitioned link can hang a socket past any server-side timeout);
- the first renewal that is not confirmed (lost, expired, error, or no
  answer in time) cancels the execution and ends the heartbeat: a lease is
  never resurrected;
- SIGSTOP of the process stops this thread too (that is the point of
  experiment B): the fence, not the heartbeat, protects the database.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from harness import injection
from reference_impl import metrics
from reference_impl.cancellation import Cancellation
from reference_impl.db import ConnectionSpec, Session
from reference_impl.leases import Lease, Leases
from reference_impl.logs import log

_log = logging.getLogger("reference_impl.heartbeat")


class Heartbeat:
    """Renews one lease every ``interval_ms`` until stopped or unconfirmed."""

    def __init__(
        self,
        spec: ConnectionSpec,
        leases: Leases,
        lease: Lease,
        *,
        ttl_ms: int,
        interval_ms: int,
        timeout_ms: int,
        cancel: Cancellation,
    ) -> None:
        self.spec = spec.with_timeouts(timeout_ms)
        self.leases = leases
        self.lease = lease
        self.ttl_ms = ttl_ms
        self.interval_s = interval_ms / 1000.0
        self.timeout_s = timeout_ms / 1000.0
        self.cancel = cancel
        self._stop = threading.Event()
        self._session = Session(self.spec)
        # The early connect and each renewal use the session one at a time.
        self._session_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self.last_outcome: str | None = None

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing. The loop looks at the stop flag again between waking
        and renewing, so a heartbeat held there (a descheduled thread, a
        barrier) never renews after this returns and need not be waited for;
        only a renewal already sent is, for its own bound (twice over, at least
        a second: a busy machine's stall), before its connection is closed."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(max(2 * self.timeout_s, 1.0))
        self._session.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _connect_early(self) -> None:
        # Connect before the first tick, outside any renewal's bound: a
        # renewal's timeout is for the renewal, not for a TCP connect and a
        # login (blind hunt 61's reader; the Go reference does the same). A
        # connect that fails leaves the first renewal to connect, bounded.
        with self._session_lock, contextlib.suppress(Exception):
            _ = self._session.conn
        if self._stop.is_set():  # stopped while connecting: stop() may have closed before
            self._session.close()

    def _loop(self) -> None:
        # In a thread of its own, never in the loop's way: a link that goes
        # dark mid-login (TCP connected, the tenant check sent) never answers,
        # and a loop waiting on it never renewed and never cancelled the work
        # (S[pg_blackhole_mid_step] in CI). The first renewal waits for this
        # connect within its own bound, and an unanswered one is unconfirmed.
        threading.Thread(target=self._connect_early, name="heartbeat connect", daemon=True).start()
        while not self._stop.wait(self.interval_s):
            injection.point("before_renew", run_id=self.lease.run_id, epoch=self.lease.epoch)
            if self._stop.is_set():
                return
            outcome = self.renew_once()
            self.last_outcome = outcome
            if outcome != "renewed":
                self.on_unconfirmed(outcome)
                return
            # The renewal committed: the lease outlives this process by up to
            # one lease duration, the execution has not gone on yet.
            injection.point("after_renew_commit", run_id=self.lease.run_id, epoch=self.lease.epoch)

    def renew_once(self) -> str:
        """One bounded renewal: ``renewed``, a lease miss cause, or ``unknown``."""
        box: dict[str, Any] = {}
        lease = self.lease

        def attempt() -> None:
            try:
                with self._session_lock:  # after the early connect, if it still runs
                    box["r"] = self.leases.renew(self._session.conn, lease, self.ttl_ms)
            except Exception as exc:
                # Any failure leaves the renewal unconfirmed, not only the
                # driver's errors (a reconnect refused for its tenant
                # binding, say): with psycopg.Error alone the thread died,
                # "r" was never set and the heartbeat crashed without
                # cancelling the work (blind hunt 68's reader).
                box["exc"] = exc
                self._session.discard()

        injection.record("invoke", "renew", run_id=lease.run_id, epoch=lease.epoch)
        worker = threading.Thread(target=attempt, name="renew", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive() or "exc" in box:
            # No answer in time, or an error: the renewal may or may not have
            # happened. Unconfirmed is enough to stop.
            error = box.get("exc") or TimeoutError("renewal timed out")
            metrics.lease_renew_total.labels("unknown").inc()
            metrics.lease_renewal_failures_total.inc()
            injection.record("info", "renew", run_id=lease.run_id, epoch=lease.epoch, error=error)
            return "unknown"
        renewal = box["r"]
        if renewal.ok:
            metrics.lease_renew_total.labels("success").inc()
            injection.record("ok", "renew", run_id=lease.run_id, epoch=lease.epoch)
            return "renewed"
        metrics.lease_renew_total.labels("lost").inc()
        metrics.lease_renewal_failures_total.inc()
        if renewal.outcome in ("lost", "expired"):
            metrics.stale_fence_rejections_total.inc()
        injection.record(
            "fail",
            "renew",
            run_id=lease.run_id,
            epoch=lease.epoch,
            error="LeaseLost",
            detail={"outcome": renewal.outcome},
        )
        return str(renewal.outcome)

    def on_unconfirmed(self, outcome: str) -> None:
        """An unconfirmed renewal cancels the execution (no new side effects)."""
        log(
            _log,
            logging.WARNING,
            "lease renewal unconfirmed: cancelling execution",
            run_id=str(self.lease.run_id),
            owner=self.lease.owner,
            epoch=self.lease.epoch,
            outcome=outcome,
        )
        self.cancel.cancel(f"lease renewal {outcome}")

"""Rule 2, 3, 9 and 11 mutants: the protected write and what its COMMIT means."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import psycopg

from reference_impl.db import Conn, Notice
from reference_impl.ids import new_event_id
from reference_impl.leases import Lease
from reference_impl.mutants.base import Component, Mutant, SqlOverlay, Statement
from reference_impl.protected import ProtectedWriter, Write, Written


class SplitTransactionWriter(ProtectedWriter):
    """Validates the lease in a transaction of its own, then writes in another."""

    def _begin_locked(self, conn: Conn, lease: Lease) -> dict[str, Any]:
        # MUTANT: lock_lease runs in autocommit, so its row lock ends with its
        # own implicit COMMIT; the write's transaction begins afterwards.
        locked = conn.execute(
            self.q.sql("lock_lease"),
            {"run_id": lease.run_id, "owner": lease.owner, "epoch": lease.epoch},
        ).fetchone()
        assert locked is not None
        conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        return locked


class RollbackAssumingWriter(ProtectedWriter):
    """Takes a commit of unknown outcome for a rollback."""

    def resolve_unknown(self, w: Write, cause: BaseException) -> Written | None:
        # MUTANT: no read-back; the write is sent again as a NEW event (new
        # event_id), retrying while the database is unreachable as a client
        # retrying a "failed" transaction would.
        fresh = dataclasses.replace(w, event_id=new_event_id())
        for attempt in range(5):
            try:
                return self.write(fresh)
            except psycopg.OperationalError:
                time.sleep(0.1 * (attempt + 1))
        return self.write(fresh)


class WarningTrustingWriter(ProtectedWriter):
    """Takes a COMMIT answered with a warning for a durable success."""

    def on_commit_warning(self, w: Write, notices: list[Notice], written: Written) -> Written:
        # MUTANT: the cancelled wait for the synchronous standby is ignored.
        return written


class AlwaysSteppedWriter(ProtectedWriter):
    """Takes the stepped path whatever FENCECHECK_WRITE_PATH asks for."""

    def _attempt(self, w: Write) -> Written:
        # MUTANT: the production (fast) path is never taken under the harness,
        # so nothing the matrix proves about protected writes is about it.
        return self._stepped(w)


MUTANTS = (
    Mutant(
        "write_without_lease_check",
        2,
        ("K",),
        "the protected write locks the lease row but validates nothing (owner, epoch, "
        "expiry): only the revision CAS stands in a stale holder's way",
        SqlOverlay("write_without_lease_check.sql", "fencecheck.protected_write_fast"),
    ),
    Mutant(
        "write_ignores_expiry",
        2,
        ("K",),
        "the protected write checks owner and epoch but not expiry: a holder whose "
        "lease ran out, with nobody taking over yet, still writes",
        SqlOverlay("write_ignores_expiry.sql", "fencecheck.protected_write_fast"),
    ),
    Mutant(
        "write_ignores_epoch",
        2,
        ("B",),
        "the protected write checks expiry but not owner and epoch: after a takeover "
        "the old holder's write is judged by the new holder's live lease and the "
        "revision alone",
        SqlOverlay("write_ignores_epoch.sql", "fencecheck.protected_write_fast"),
    ),
    Mutant(
        "checkpoint_keeps_old_schema_version",
        13,
        ("A", "M"),
        "the fast path's checkpoint leaves the run's checkpoint_schema_version as it was: "
        "the run row names another version than its latest checkpoint's",
        SqlOverlay("checkpoint_keeps_old_schema_version.sql", "fencecheck.protected_write_fast"),
    ),
    Mutant(
        "fast_write_without_revision_guard",
        3,
        ("R",),
        "on the fast write path every transition but a checkpoint skips the revision guard: "
        "the current holder's intent or completion at a revision the run has left behind "
        "commits instead of being refused (a retried write racing a checkpoint)",
        SqlOverlay(
            "fast_write_without_revision_guard.sql", "fencecheck._protected_write_lock_first"
        ),
    ),
    Mutant(
        "write_checks_owner_not_epoch",
        2,
        ("R",),
        "the protected write checks owner, expiry and revision but not the epoch: a "
        "session naming the new holder's owner writes with an old fencing token",
        SqlOverlay("write_checks_owner_not_epoch.sql", "fencecheck.protected_write_fast"),
    ),
    Mutant(
        "write_path_ignored",
        2,
        ("A",),
        "the protected writer ignores the write path the harness asks for and always "
        "takes the stepped path, so the production (fast) path is never under test",
        Component("writer_cls", AlwaysSteppedWriter),
    ),
    Mutant(
        "checkpoint_without_outbox_event",
        2,
        ("A",),
        "the fast path commits a checkpoint without its outbox event (the event is "
        "'sent later'): state changes that nothing downstream hears of",
        SqlOverlay("checkpoint_without_outbox_event.sql", "fencecheck.protected_write_fast"),
    ),
    Mutant(
        "write_without_row_lock",
        2,
        ("D",),
        "the lease is validated from a plain read (no FOR UPDATE): nothing holds the "
        "row from the check to the commit, so a takeover does not wait for a write "
        "already validated",
        SqlOverlay("write_without_row_lock.sql", "fencecheck.lock_lease"),
    ),
    Mutant(
        "lease_check_separate_tx",
        2,
        ("D",),
        "the lease is locked and validated in a transaction of its own, committed "
        "before the write's transaction begins: the row lock does not span check and "
        "write, so a takeover slips in between",
        Component("writer_cls", SplitTransactionWriter),
    ),
    Mutant(
        "write_without_revision_cas",
        3,
        ("C",),
        "the protected write does not compare the revision: of two same-epoch writes "
        "with the same expected revision both commit",
        SqlOverlay("write_without_revision_cas.sql", "fencecheck.protected_write"),
    ),
    Mutant(
        "commit_unknown_as_rollback",
        9,
        ("O",),
        "a commit whose outcome is unknown is taken for a rollback without reading "
        "back: the write is sent again under a new event_id",
        Component("writer_cls", RollbackAssumingWriter),
    ),
    Mutant(
        "sync_warning_as_success",
        11,
        ("H",),
        "a COMMIT answered with a WARNING (the cancelled wait for the synchronous "
        "standby) is reported as a durable success",
        Component("writer_cls", WarningTrustingWriter),
    ),
    Mutant(
        "assumes_sync_replication",
        11,
        ("H",),
        "the worker does not read the server's replication settings but assumes "
        "synchronous replication: it claims the sync guarantee under async",
        Statement(
            "durability_settings",
            "SELECT 'on'::text AS synchronous_commit,"
            " '*'::text AS synchronous_standby_names,"
            " pg_is_in_recovery() AS in_recovery,"
            " current_setting('server_version') AS server_version",
        ),
    ),
    Mutant(
        "local_commit_taken_for_sync",
        11,
        ("H",),
        "any synchronous_commit level but off is taken for a synchronous one: with standby "
        "names set and synchronous_commit = local (commits do not wait for the standby) the "
        "worker declares sync (blind bug hunt round 4, #08)",
        Statement(
            "durability_settings",
            "SELECT CASE current_setting('synchronous_commit') WHEN 'off' THEN 'off'"
            " ELSE 'on' END AS synchronous_commit,"
            " current_setting('synchronous_standby_names') AS synchronous_standby_names,"
            " pg_is_in_recovery() AS in_recovery,"
            " current_setting('server_version') AS server_version",
        ),
    ),
)

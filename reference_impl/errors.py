"""Errors of the protocol. Each class's docstring is its default message.

The class names are the contract's error vocabulary (worker contract,
sections 4 and 5): the event history and the ops replies carry them as they
are. Database rejections are mapped to these classes by SQLSTATE in
:mod:`reference_impl.sqlstate`, never by message text.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """The protocol refused the operation."""

    def __init__(self, message: str | None = None, *, reason: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or type(self).__name__).strip())
        #: Short machine-readable cause (e.g. ``expired``, ``lost``, ``missing``).
        self.reason = reason


class LeaseLost(ProtocolError):
    """The lease is no longer ours (taken over, released, expired or gone): no write right."""


class RevisionConflict(ProtocolError):
    """Another write of the same epoch advanced the run's revision first."""


class StateConflict(ProtocolError):
    """The run's status does not allow this transition."""


class NotClaimable(ProtocolError):
    """The run cannot be claimed now (held, not due, paused, terminal or missing)."""


class RunNotFound(ProtocolError):
    """No such run or task for this tenant."""


class TaskExists(ProtocolError):
    """The task already exists; retry it to start a new run."""


class RunNotRetryable(ProtocolError):
    """The task's active run is still live; cancel it before retrying."""


class IntentConflict(ProtocolError):
    """The operation_id is registered with a different run, tool or request digest."""


class LedgerConflict(ProtocolError):
    """The ledger row does not match the dispatch claim (owner, revision, digest or status)."""


class CommitOutcomeUnknown(ProtocolError):
    """The commit's outcome is unknown: read back by event_id before doing anything else."""


class CommitInconsistent(ProtocolError):
    """Read-back found the checkpoint or the outbox row, not both: run frozen, alert raised."""


class SchemaVersionUnknown(ProtocolError):
    """The checkpoint's schema_version is not one this code can read or migrate."""


class CheckpointCorrupt(ProtocolError):
    """The checkpoint's state does not match its stored hash."""


class ExecutionCancelled(ProtocolError):
    """The execution was cancelled (lease renewal unconfirmed or lost); no new side effects."""


class TenantUnset(ProtocolError):
    """No tenant is set for this connection; tenant-scoped tables show nothing."""


class TenantBindingMismatch(ProtocolError):
    """The login role is bound to another tenant than the one this worker acts for."""


class SensitiveDataWithoutKey(ProtocolError):
    """A sensitive field must be sealed, and no data key is configured (FENCECHECK_DATA_KEY)."""


class SerializationBudgetExceeded(ProtocolError):
    """The transaction kept failing with serialization errors (40001) past its retry budget."""


class ToolStepFrozen(ProtocolError):
    """The tool call's outcome cannot be known automatically: run paused in doubt for a person."""


class Unsupported(ProtocolError):
    """This operation is not implemented."""


class UnknownMutant(ProtocolError):
    """FENCECHECK_MUTANT names no known mutant."""


class MigrationChanged(ProtocolError):
    """An applied migration file was changed after it was applied; write a new migration."""

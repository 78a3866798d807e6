"""The protocol as one swappable object, and the ONE place a mutant is picked.

Every rule lives in one replaceable place: a named SQL statement
(``Protocol.queries``), a database function (replaced by a SQL overlay that
``migrate`` applies), or one method of one component class below. A mutant
is a ``Protocol`` subclass that swaps exactly one of these; the correct code
carries no mutant checks. ``load_protocol`` is the only code that reads
FENCECHECK_MUTANT.

| rule | place |
|---|---|
| 1 lease grant/renew/release | fencecheck._grant / renew / release (SQL), ``Leases`` |
| 2 lock + validate in the write's transaction | fencecheck.lock_lease, fencecheck.protected_write (stepped path, the one the harness runs); fencecheck.protected_write_fast (fast path: the same checks inline; a checkpoint locks the row by its UPDATE and judges expiry after the lock, 007) |
| 3 revision CAS | fencecheck.protected_write, fencecheck.protected_write_fast (``WHERE revision = expected``) |
| 4 ledger | fencecheck.dispatch_claim / record_tool_result / reconcile_expire_claims, ``Reconciler``; retry backoff ``Protocol.backoff_ms`` |
| 5 stable operation_id, timeout never failure | ``Protocol.operation_id``, ``Dispatcher.on_unknown`` |
| 6 cancel | fencecheck.cancel_run |
| 7 retry isolation, callbacks | fencecheck.retry_run, fencecheck.deliver_callback |
| 8 heartbeat cancels | ``Heartbeat.on_unconfirmed`` |
| 9 commit outcome unknown | ``ProtectedWriter.resolve_unknown`` |
| 10 consumer dedup | ``Consumer.process`` |
| 11 durability | ``ProtectedWriter.on_commit_warning``, ``durability.read_contract`` |
| 12 tenants | RLS policies + grants (002_schema.sql, 005_privileges.sql) |
| 13 checkpoint schema | ``Protocol.decode_checkpoint`` (checkpoint_schema.decode) |
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from reference_impl import backoff, checkpoint_schema, ids
from reference_impl.errors import UnknownMutant
from reference_impl.heartbeat import Heartbeat
from reference_impl.leases import Leases
from reference_impl.ledger import Dispatcher, Ledger, Reconciler
from reference_impl.outbox import Consumer, Relay
from reference_impl.protected import ProtectedWriter
from reference_impl.queries import Queries
from reference_impl.runs import RunControl


class Protocol:
    """The correct protocol."""

    name: ClassVar[str] = "correct"
    #: Experiment id expected to catch this variant (mutants only).
    caught_by: ClassVar[str | None] = None
    #: SQL files ``migrate`` applies after the migrations (mutants only).
    sql_overlays: ClassVar[tuple[Path, ...]] = ()

    leases_cls: ClassVar[type[Leases]] = Leases
    writer_cls: ClassVar[type[ProtectedWriter]] = ProtectedWriter
    ledger_cls: ClassVar[type[Ledger]] = Ledger
    dispatcher_cls: ClassVar[type[Dispatcher]] = Dispatcher
    reconciler_cls: ClassVar[type[Reconciler]] = Reconciler
    heartbeat_cls: ClassVar[type[Heartbeat]] = Heartbeat
    relay_cls: ClassVar[type[Relay]] = Relay
    consumer_cls: ClassVar[type[Consumer]] = Consumer
    runs_cls: ClassVar[type[RunControl]] = RunControl

    def __init__(self) -> None:
        self.queries = self.load_queries()

    def load_queries(self) -> Queries:
        """The named statements; a mutant may ``replace`` one."""
        return Queries.load()

    def operation_id(self, tenant: str, run_id: str, step_id: str, effect_version: int) -> str:
        """Rule 5: the intent's identity, never worker, epoch, attempt or time."""
        return ids.operation_id(tenant, run_id, step_id, effect_version)

    def backoff_ms(self, run_id: str, attempt: int) -> int:
        """Rule 4 (retries): the delay before a requeued run's next attempt grows
        with ``attempt`` and is jittered per run (``backoff.delay_ms``)."""
        return backoff.delay_ms(run_id, attempt)

    def decode_checkpoint(
        self, revision: int, schema_version: int | None, state: Any, stored_hash: bytes | None
    ) -> checkpoint_schema.Checkpoint:
        """Rule 13: migrate explicitly or refuse; never parse to zero values."""
        return checkpoint_schema.decode(revision, schema_version, state, stored_hash)


def load_protocol(mutant: str | None) -> Protocol:
    """The correct protocol, or the one named mutant (reference_impl.mutants.REGISTRY)."""
    if not mutant:
        return Protocol()
    try:
        module = importlib.import_module("reference_impl.mutants")
    except ModuleNotFoundError as exc:
        raise UnknownMutant(f"mutant {mutant!r} requested but no mutants are installed") from exc
    registry: dict[str, Callable[[], Protocol]] = getattr(module, "REGISTRY", {})
    if mutant not in registry:
        known = ", ".join(sorted(registry)) or "none"
        raise UnknownMutant(f"unknown mutant {mutant!r}; known: {known}")
    return registry[mutant]()

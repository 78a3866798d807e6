"""One worker process's wiring: settings + protocol -> connected components."""

from __future__ import annotations

from reference_impl.cancellation import Cancellation
from reference_impl.config import Settings
from reference_impl.db import Conn, ConnectionSpec, Session
from reference_impl.heartbeat import Heartbeat
from reference_impl.leases import Lease
from reference_impl.protected import ProtectedWriter
from reference_impl.protocol import Protocol
from reference_impl.sealing import Sealer, key_from
from reference_impl.tools import ToolGateway


class Runtime:
    """Components of one worker session, sharing one main-thread connection."""

    def __init__(self, settings: Settings, protocol: Protocol) -> None:
        if not settings.dsn:
            raise ValueError("no database: set FENCECHECK_DSN or pass --dsn")
        self.settings = settings
        self.protocol = protocol
        q = protocol.queries
        self.spec = ConnectionSpec(settings.dsn, settings.tenant, settings.worker_id)
        self.sealer = Sealer(key_from(settings.data_key))
        self.session = Session(self.spec)
        self.tools = ToolGateway(
            settings.tool_url, settings.tool_timeout_ms / 1000.0, settings.broker_url
        )
        self.leases = protocol.leases_cls(q)
        self.writer = protocol.writer_cls(self.session, q)
        self.ledger = protocol.ledger_cls(q, settings.dispatch_ttl_ms)
        self.dispatcher = protocol.dispatcher_cls(self.ledger, self.tools, settings.owner)
        self.dispatcher.sealer = self.sealer
        self.reconciler = protocol.reconciler_cls(self.ledger, self.dispatcher)
        self.relay = protocol.relay_cls(q, self.tools)
        self.consumer = protocol.consumer_cls(q, self.tools, settings.tenant)
        self.runs = protocol.runs_cls(q, protocol.decode_checkpoint)
        self.runs.sealer = self.sealer

    @property
    def conn(self) -> Conn:
        return self.session.conn

    @property
    def owner(self) -> str:
        return self.settings.owner

    def session_for(self) -> Session:
        """A separate session of the same login role (for another thread)."""
        return Session(self.spec)

    def writer_for(self, session: Session) -> ProtectedWriter:
        return self.protocol.writer_cls(session, self.protocol.queries)

    def heartbeat(
        self,
        lease: Lease,
        cancel: Cancellation,
        interval_ms: int | None = None,
        timeout_ms: int | None = None,
    ) -> Heartbeat:
        s = self.settings
        return self.protocol.heartbeat_cls(
            self.spec,
            self.leases,
            lease,
            ttl_ms=s.lease_ttl_ms,
            interval_ms=interval_ms or s.heartbeat_ms,
            timeout_ms=timeout_ms or s.heartbeat_timeout_ms,
            cancel=cancel,
        )

    def close(self) -> None:
        self.session.close()

"""The external tool, as the protocol sees it: capability, create, query.

The adapter passes the stable operation_id to the tool as its idempotency
key and classifies each answer by whether the tool may have acted
(mock_tool.errors): a timeout or 5xx is *unknown*, never a failure.
"""

from __future__ import annotations

import threading
from typing import Any

from mock_tool.client import CreateResult, QueryResult, ToolClient
from mock_tool.constants import DEFAULT_TOOLS
from mock_tool.errors import ToolError

CAPABILITIES = ("idempotent", "deterministic_id", "query", "none")


class ToolGateway:
    """One tool server (and broker); capabilities learned from its /health."""

    def __init__(self, base_url: str | None, timeout_s: float, broker_url: str | None = None):
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._client = ToolClient(base_url, timeout_s) if base_url else None
        self._broker = ToolClient(broker_url, timeout_s) if broker_url else self._client
        self._caps: dict[str, str] | None = None
        self._retention_s: float | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> ToolClient:
        if self._client is None:
            raise RuntimeError("no tool endpoint configured (FENCECHECK_TOOL_URL / --tool-url)")
        return self._client

    @property
    def broker(self) -> ToolClient:
        if self._broker is None:
            raise RuntimeError("no broker configured (FENCECHECK_BROKER_URL / --broker-url)")
        return self._broker

    def capability(self, tool: str) -> str:
        """What ``tool`` promises; the server's own answer, else the default tool set."""
        with self._lock:
            if self._caps is None and self._client is not None:
                try:
                    health = self._client.health()
                    tools = health.get("tools", {})
                    if isinstance(tools, dict):
                        self._caps = {str(k): str(v) for k, v in tools.items()}
                    declared = (health.get("server") or {}).get("idempotency_retention_s")
                    if isinstance(declared, int | float):
                        self._retention_s = float(declared)
                except ToolError:
                    pass  # fall back to the defaults below, and ask again next time
            caps = self._caps or dict(DEFAULT_TOOLS)
        cap = caps.get(tool)
        if cap not in CAPABILITIES:
            raise ValueError(f"tool {tool!r} is unknown (known: {sorted(caps)})")
        return cap

    def retention_ms(self, tool: str) -> int | None:
        """How long ``tool`` keeps an idempotency key, as it declares (idempotent tools
        only; None when it declares none)."""
        if self.capability(tool) != "idempotent" or self._retention_s is None:
            return None
        # Rounded, not truncated: 1.005 s is 1004.999... ms in binary floating point.
        return round(self._retention_s * 1000)

    def create(
        self,
        tool: str,
        operation_id: str,
        run_id: str,
        epoch: int,
        request: dict[str, Any],
        callback_url: str | None = None,
        callback_delay_ms: int | None = None,
    ) -> CreateResult:
        return self.client.create(
            tool, operation_id, run_id, epoch, request, callback_url, callback_delay_ms
        )

    def query(self, tool: str, operation_id: str) -> QueryResult | None:
        return self.client.query(tool, operation_id)

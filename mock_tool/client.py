"""Python client of the mock tool (standard library only).

Invariant: every failure is classified by *whether the tool may have acted*,
from the HTTP status and the transport error type only, never message text:

=====================================  ==========================================
what happened                          raised
=====================================  ==========================================
connect failed (request never sent)    :class:`ToolUnavailable` (a ToolRejected,
                                       ``retryable=True``)
400                                    :class:`ToolBadRequest` (a ToolRejected)
409                                    :class:`ToolConflict` (``resource_id``)
429                                    :class:`ToolRejected`, ``retryable=True``
other 4xx (422 ...)                    :class:`ToolRejected`, ``retryable=False``
501                                    :class:`QueryUnsupported`
timeout / reset / closed, no answer    :class:`ToolOutcomeUnknown`
202 accepted, no result in it          :class:`ToolOutcomeUnknown` (the tool
                                       took it: only a query tells the result)
5xx, or any other unexpected answer    :class:`ToolOutcomeUnknown`
=====================================  ==========================================

For read-only calls (query, export, ...) ToolOutcomeUnknown simply means "no
answer"; nothing can have changed.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from mock_tool.errors import (
    QueryUnsupported,
    ToolBadRequest,
    ToolConflict,
    ToolError,
    ToolOutcomeUnknown,
    ToolRejected,
    ToolUnavailable,
)


@dataclass(frozen=True)
class CreateResult:
    """A create the tool acknowledged: a new resource, or an idempotent replay."""

    operation_id: str
    resource_id: str
    replayed: bool
    http_status: int


@dataclass(frozen=True)
class QueryResult:
    """The tool's own record of an operation (the remote fact).

    ``resource_ids`` lists every resource created under the operation_id: more
    than one means a non-idempotent tool created duplicates.
    """

    operation_id: str
    resource_id: str
    status: str
    run_id: str
    epoch: int
    created_at: float
    resource_ids: tuple[str, ...]
    http_status: int
    #: SHA-256 of the canonical JSON of the request that created the resource.
    body_digest: str | None = None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _seg(value: str) -> str:
    # safe="": an operation_id containing "/" must stay one path segment.
    return quote(value, safe="")


def error_for_status(status: int, body: dict[str, Any], what: str) -> ToolError:
    """The exception for a non-success answer, chosen by status code alone."""
    detail = body.get("error")
    message = f"{what}: HTTP {status}" + (f": {detail}" if detail else "")
    if status == 400:
        return ToolBadRequest(message, http_status=status, body=body)
    if status == 409:
        rid = body.get("resource_id")
        return ToolConflict(
            message,
            http_status=status,
            body=body,
            resource_id=rid if isinstance(rid, str) else None,
        )
    if status == 429:
        return ToolRejected(message, http_status=status, body=body, retryable=True)
    if status == 501:
        return QueryUnsupported(message, http_status=status, body=body)
    if 400 <= status < 500:
        return ToolRejected(message, http_status=status, body=body, retryable=False)
    return ToolOutcomeUnknown(message, http_status=status, body=body)


class ToolClient:
    """Talks to one mock tool server. Thread-safe: one connection per call."""

    def __init__(self, base_url: str, timeout_s: float = 5.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"base_url must look like http://127.0.0.1:PORT, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")

    def _call(
        self, method: str, path: str, body: Any = None, *, what: str
    ) -> tuple[int, dict[str, Any]]:
        """One HTTP exchange; transport failures become ToolUnavailable/ToolOutcomeUnknown."""
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        try:
            try:
                conn.connect()
            except OSError as exc:
                # Nothing was sent: the tool cannot have acted.
                raise ToolUnavailable(f"{what}: cannot connect to {self.base_url}: {exc}") from exc
            headers = {"Accept": "application/json"}
            data: bytes | None = None
            if body is not None:
                data = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
                headers["Content-Type"] = "application/json"
            try:
                conn.request(method, self._prefix + path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                # Sent (maybe partly) but no complete answer: the tool may have acted.
                raise ToolOutcomeUnknown(
                    f"{what}: no answer from {self.base_url}: {type(exc).__name__}: {exc}"
                ) from exc
        finally:
            conn.close()
        try:
            decoded = json.loads(raw.decode("utf-8")) if raw else {}
        except (UnicodeDecodeError, ValueError):
            decoded = {"error": raw[:200].decode("utf-8", "replace")}
        if not isinstance(decoded, dict):
            decoded = {"value": decoded}
        return resp.status, decoded

    def _ok(
        self, method: str, path: str, body: Any = None, *, what: str, ok: tuple[int, ...] = (200,)
    ) -> dict[str, Any]:
        status, decoded = self._call(method, path, body, what=what)
        if status not in ok:
            raise error_for_status(status, decoded, what)
        return decoded

    # -- tool API -------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /health``: ``{"ok": true, "tools": {name: capability}, ...}``."""
        return self._ok("GET", "/health", what="health")

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
        """Ask ``tool`` to create a resource for ``operation_id``.

        Returns only when the tool acknowledged (201 new, 200 replay); raises
        per the module table otherwise.
        """
        body: dict[str, Any] = {
            "operation_id": operation_id,
            "run_id": run_id,
            "epoch": epoch,
            "request": request,
        }
        if callback_url is not None:
            body["callback_url"] = callback_url
        if callback_delay_ms is not None:
            body["callback_delay_ms"] = callback_delay_ms
        what = f"create {tool}/{operation_id}"
        status, decoded = self._call("POST", f"/tools/{_seg(tool)}/operations", body, what=what)
        if status not in (200, 201):
            raise error_for_status(status, decoded, what)
        rid = decoded.get("resource_id")
        if not isinstance(rid, str):
            # Acknowledged but unreadable: we cannot tell what was created.
            raise ToolOutcomeUnknown(f"{what}: answer without resource_id", http_status=status)
        return CreateResult(
            operation_id=str(decoded.get("operation_id", operation_id)),
            resource_id=rid,
            replayed=bool(decoded.get("replayed", status == 200)),
            http_status=status,
        )

    def query(self, tool: str, operation_id: str) -> QueryResult | None:
        """The tool's record of ``operation_id``; None when it has none (404).

        A 404 that says a create of it is still in progress raises
        ToolOutcomeUnknown: "not found" is then no proof it will not happen.
        """
        what = f"query {tool}/{operation_id}"
        path = f"/tools/{_seg(tool)}/operations/{_seg(operation_id)}"
        status, decoded = self._call("GET", path, what=what)
        if status == 404:
            if isinstance(decoded, dict) and decoded.get("in_progress") is True:
                raise ToolOutcomeUnknown(
                    f"{what}: a create is still in progress", http_status=status, body=decoded
                )
            return None
        if status != 200:
            raise error_for_status(status, decoded, what)
        rid = str(decoded["resource_id"])
        return QueryResult(
            operation_id=str(decoded.get("operation_id", operation_id)),
            resource_id=rid,
            status=str(decoded.get("status", "succeeded")),
            run_id=str(decoded.get("run_id", "")),
            epoch=int(decoded.get("epoch", 0)),
            created_at=float(decoded.get("created_at", 0.0)),
            resource_ids=tuple(str(r) for r in decoded.get("resource_ids", [rid])),
            http_status=status,
            body_digest=_opt_str(decoded.get("body_digest")),
        )

    # -- broker ---------------------------------------------------------

    def publish(self, event_id: str, topic: str, payload: Any) -> int:
        """Publish one message; returns its broker sequence number once acked."""
        decoded = self._ok(
            "POST",
            "/broker/publish",
            {"event_id": event_id, "topic": topic, "payload": payload},
            what=f"publish {event_id}",
        )
        if decoded.get("ack") is not True:
            # A 200 that does not acknowledge (a nack): the message was not taken.
            raise ToolRejected(
                f"publish {event_id}: the broker did not acknowledge it",
                http_status=200,
                body=decoded,
                retryable=True,
            )
        return int(decoded["seq"])

    def broker_messages(self, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Messages with ``seq > after`` in order (duplicates included)."""
        query = f"?after={after}" + (f"&limit={limit}" if limit is not None else "")
        decoded = self._ok("GET", f"/broker/messages{query}", what="broker messages")
        messages: list[dict[str, Any]] = decoded["messages"]
        return messages

    # -- admin ----------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """The tool's whole log: requests, resources, messages, callbacks, ..."""
        return self._ok("GET", "/admin/export", what="export")

    def set_fault(
        self,
        tool: str,
        mode: str,
        count: int = 1,
        ms: int | None = None,
        skip: int = 0,
        run_id: str | None = None,
    ) -> str:
        """Arm a fault for the next ``count`` matching requests after ``skip`` of them
        passed: creates of ``tool`` ("*" = any tool; ``run_id``: of that run
        only), or the broker's publishes or deliveries (``tool="broker"``, a
        broker mode); returns its id."""
        body: dict[str, Any] = {"tool": tool, "mode": mode, "count": count}
        if ms is not None:
            body["ms"] = ms
        if skip:
            body["skip"] = skip
        if run_id is not None:
            body["run_id"] = run_id
        decoded = self._ok("POST", "/admin/faults", body, what=f"set fault {mode}")
        return str(decoded["fault_id"])

    def clear_faults(self) -> None:
        """Disarm every fault (hung requests stay hung until :meth:`release`)."""
        self._ok("DELETE", "/admin/faults", what="clear faults")

    def faults(self) -> dict[str, Any]:
        """Active faults, their history and the requests hanging right now."""
        return self._ok("GET", "/admin/faults", what="list faults")

    def callback_now(self, tool: str, operation_id: str) -> dict[str, Any]:
        """The callback of ``operation_id``'s resource, issued now for the caller to
        relay (logged by the tool); ToolRejected (404) when the tool holds none."""
        decoded = self._ok(
            "POST",
            "/admin/callbacks",
            {"tool": tool, "operation_id": operation_id},
            what=f"callback of {tool}/{operation_id}",
        )
        payload: dict[str, Any] = decoded["payload"]
        return payload

    def release(self, drop: bool = False) -> int:
        """Release every hung request; returns how many there were. With
        ``drop``, requests held on the network (``arrive_held``) are lost there:
        the tool never sees them and their callers get no answer."""
        body = {"drop": True} if drop else {}
        return int(self._ok("POST", "/admin/release", body, what="release")["released"])

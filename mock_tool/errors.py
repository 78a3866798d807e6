"""Errors raised by :mod:`mock_tool.client`.

The classes answer the one question a caller of an external tool must get
right: *did the tool act?*

* :class:`ToolRejected` (and its subclasses) -- definitely not: the tool
  answered with a 4xx, or the request never left this process.
* :class:`ToolConflict` -- the resource already exists (409); nothing new was
  created, and the caller must compare the existing resource with its intent.
* :class:`ToolOutcomeUnknown` -- maybe: a timeout, a connection closed without
  an answer, or a 5xx. The caller must record *unknown* and converge by query
  or same-key retry, never treat it as a failure.
* :class:`QueryUnsupported` -- the tool offers no query (501).

Classification is by HTTP status and exception type only, never by message
text. Each class's docstring is its default message.
"""

from __future__ import annotations

from typing import Any


class ToolError(Exception):
    """The external tool call failed."""

    def __init__(
        self,
        message: str | None = None,
        *,
        http_status: int | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        default = (type(self).__doc__ or type(self).__name__).strip()
        super().__init__(message or default)
        #: HTTP status the tool answered with; None when there was no answer.
        self.http_status = http_status
        #: Decoded JSON answer of the tool, when there was one.
        self.body: dict[str, Any] = body or {}


class ToolRejected(ToolError):
    """The tool rejected the request; nothing was done."""

    def __init__(
        self,
        message: str | None = None,
        *,
        http_status: int | None = None,
        body: dict[str, Any] | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(message, http_status=http_status, body=body)
        #: True when the same request may succeed later (429, unreachable tool).
        self.retryable = retryable


class ToolBadRequest(ToolRejected):
    """The tool refused the request as malformed (400); nothing was done."""


class ToolUnavailable(ToolRejected):
    """The tool could not be reached; the request was never sent."""

    def __init__(
        self,
        message: str | None = None,
        *,
        http_status: int | None = None,
        body: dict[str, Any] | None = None,
        retryable: bool = True,
    ) -> None:
        super().__init__(message, http_status=http_status, body=body, retryable=retryable)


class ToolConflict(ToolError):
    """The resource already exists (409); no new resource was created."""

    def __init__(
        self,
        message: str | None = None,
        *,
        http_status: int | None = 409,
        body: dict[str, Any] | None = None,
        resource_id: str | None = None,
    ) -> None:
        super().__init__(message, http_status=http_status, body=body)
        #: Id of the resource that already exists.
        self.resource_id = resource_id


class ToolOutcomeUnknown(ToolError):
    """No definite answer from the tool; it may or may not have acted."""


class QueryUnsupported(ToolError):
    """This tool offers no query by operation_id (501)."""

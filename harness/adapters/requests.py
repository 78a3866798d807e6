"""What the in-repo adapters share of the ops channel (worker contract section 5)."""

from __future__ import annotations

import json
from typing import Any


class BadRequest(Exception):
    """A line on the ops channel that is no request object."""


def parse_request(line: str) -> dict[str, Any]:
    """One request line as its object; BadRequest for a line that is none
    (not JSON, or JSON that is no object), which the session answers with
    ``id`` null before it goes on."""
    try:
        request = json.loads(line)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    if not isinstance(request, dict):
        raise BadRequest("a request is a JSON object")
    return request

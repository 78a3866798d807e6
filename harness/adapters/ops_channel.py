"""What the in-repo Python adapters share of the ops channel (worker contract
section 5): a request line read, a reply line written, and the loop that
serves stdin. Each driver brings its own ops; the channel is the same."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from harness import injection


class BadRequest(Exception):
    """A line on the ops channel that is no request object."""


class NotClaimable(Exception):
    """Nothing to claim (the run is held by a live worker, or finished)."""


class RunNotFound(Exception):
    """No run (job) has that id."""


#: The contract's error classes of the exceptions above; any other exception
#: is named by its type.
ERRORS: dict[type[BaseException], str] = {
    NotClaimable: "NotClaimable",
    RunNotFound: "RunNotFound",
    BadRequest: "BadRequest",
}

Driver = TypeVar("Driver")
Op = Callable[[Driver, dict[str, Any]], Awaitable[Any]]


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


def reply(request_id: Any, result: Any = None, error: BaseException | None = None) -> None:
    """One reply line on stdout: ``ok`` with the result, or the error's class."""
    if error is None:
        line = {"id": request_id, "ok": True, "result": result}
    else:
        name = next((v for k, v in ERRORS.items() if isinstance(error, k)), type(error).__name__)
        line = {"id": request_id, "ok": False, "error": name, "message": str(error)[:500]}
    sys.stdout.write(json.dumps(line, default=str) + "\n")
    sys.stdout.flush()


async def serve(ops: Mapping[str, Op[Driver]], driver: Driver, request: dict[str, Any]) -> None:
    """Answer one request with the driver's op of that name, recording its
    invoke and outcome in the event history (contract section 4)."""
    op, args = str(request.get("op")), dict(request.get("args") or {})
    handler = ops.get(op)
    if handler is None:
        reply(request.get("id"), error=type("Unsupported", (Exception,), {})(op))
        return
    injection.record("invoke", op, run_id=args.get("run_id"))
    try:
        result = await handler(driver, args)
    except Exception as exc:
        injection.record("fail", op, run_id=args.get("run_id"), error=exc)
        reply(request.get("id"), error=exc)
        return
    run_id = (result or {}).get("run_id", args.get("run_id")) if isinstance(result, dict) else None
    injection.record("ok", op, run_id=run_id)
    reply(request.get("id"), result)


async def serve_stdin(ops: Mapping[str, Op[Driver]], driver: Driver) -> None:
    """Serve request lines from stdin until it closes: a request in turn, an
    ``async`` one as a task of its own (kept till done), a line that is no
    request answered with ``id`` null while the session goes on. Stdin is
    read in a thread, so the loop keeps heartbeating while it waits."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, daemon=True).start()
    running: set[asyncio.Task[None]] = set()
    while (line := await lines.get()) is not None:
        if not line.strip():
            continue
        try:
            request = parse_request(line)
        except BadRequest as exc:
            reply(None, error=exc)
            continue
        if request.get("async"):
            task = loop.create_task(serve(ops, driver, request))
            running.add(task)
            task.add_done_callback(running.discard)
        else:
            await serve(ops, driver, request)

"""One process serving the mock tools of many experiments: ``python -m mock_tool.host``.

Starting a tool process per experiment cost a Python start-up, 0.1-0.3 s of
an experiment's wall time and of the machine's CPU, sixty times a matrix run.
A host is one process for a whole run; each experiment asks it for a tool of
its own, and gets exactly what a process of its own would give it: its own
port (so a proxy, hence a fault, in front of it touches no other
experiment's), its own storage directory with its own SQLite log (the
independent evidence), its own fault board, tools, retention and access log.
Nothing is shared between two tools but the interpreter.

Wire (one JSON object per line; requests on stdin, answers on stdout):

* ``{"open": NAME, "storage": DIR, "log": FILE, "tools": {...},
  "retention_s": S, "callback_attempts": N}`` answers ``{"opened": NAME,
  "port": P}`` or ``{"opened": NAME, "error": TEXT}``;
* ``{"close": NAME}`` answers ``{"closed": NAME}`` once the tool stopped
  serving and released its storage;
* EOF on stdin closes every tool and ends the host; so do SIGTERM and the
  death of its parent (``--exit-with-parent``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

from mock_tool.constants import DEFAULT_RETENTION_S, DEFAULT_TOOLS
from mock_tool.server import Served, ServeError, open_tool, parse_tools


class Host:
    """The tools this process serves, by name."""

    def __init__(self) -> None:
        self.tools: dict[str, tuple[Served, IO[str], threading.Thread]] = {}
        self._lock = threading.Lock()

    def open(self, request: dict[str, Any]) -> dict[str, Any]:
        name = str(request.get("open"))
        try:
            tools = parse_tools([f"{k}={v}" for k, v in (request.get("tools") or {}).items()])
        except ValueError as exc:
            return {"opened": name, "error": str(exc)}
        log_path = Path(str(request["log"]))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("a", encoding="utf-8")
        try:
            served = open_tool(
                Path(str(request["storage"])),
                tools or dict(DEFAULT_TOOLS),
                float(request.get("retention_s") or DEFAULT_RETENTION_S),
                callback_attempts=int(request.get("callback_attempts") or 3),
                log=log,
            )
        except ServeError as exc:
            log.close()
            return {"opened": name, "error": str(exc)}
        thread = threading.Thread(target=served.serve, name=f"tool-{name}", daemon=True)
        with self._lock:
            if name in self.tools:
                served.close()
                log.close()
                return {"opened": name, "error": f"a tool named {name!r} is open already"}
            self.tools[name] = (served, log, thread)
        thread.start()
        log.write(f"mock_tool: {name} serving on port {served.port} (host pid {os.getpid()})\n")
        log.flush()
        return {"opened": name, "port": served.port}

    def close(self, name: str) -> dict[str, Any]:
        with self._lock:
            entry = self.tools.pop(name, None)
        if entry is not None:
            served, log, thread = entry
            served.stop()
            thread.join(timeout=5.0)
            served.close()
            log.write("mock_tool: stopped\n")
            log.close()
        return {"closed": name}

    def close_all(self) -> None:
        with self._lock:
            names = list(self.tools)
        for name in names:
            with contextlib.suppress(Exception):
                self.close(name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mock_tool.host", description=__doc__)
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="close every tool and exit when the parent process dies",
    )
    args = parser.parse_args(argv)
    host = Host()
    out_lock = threading.Lock()

    def answer(reply: dict[str, Any]) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()

    def stop(signum: int, frame: FrameType | None) -> None:
        del frame
        host.close_all()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    if args.exit_with_parent:
        parent = os.getppid()

        def watch_parent() -> None:
            while os.getppid() == parent:
                time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGTERM)  # re-parented: our owner died

        threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
    answer({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            answer({"error": f"not a JSON request: {line[:80]!r}"})
            continue
        if "open" in request:
            # Opening binds a socket and opens SQLite: fast, in order.
            answer(host.open(request))
        elif "close" in request:
            name = str(request["close"])
            # A close waits for the tool's answers in flight: off the read loop.
            threading.Thread(target=lambda n=name: answer(host.close(n)), daemon=True).start()
        else:
            answer({"error": f"unknown request {sorted(request)}"})
    host.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())

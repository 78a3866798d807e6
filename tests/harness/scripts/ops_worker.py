"""A tiny `ops`-mode worker for the channel tests (contract section 5).

Ops: `echo` returns its args; `sleep` sleeps `args.s` seconds then answers;
`exit` exits at once without answering; `whoami` answers its pid, parent,
session, directory and FENCECHECK_WORKER_ID; anything else is Unsupported.
Requests flagged `"async": true` run on their own thread. Mode `fork-server`
serves forks of itself (worker contract §1) with the reference worker's
server, so the harness's side of it is tested against the real thing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_write_lock = threading.Lock()


def _reply(obj: dict[str, Any]) -> None:
    with _write_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def _serve(request: dict[str, Any]) -> None:
    op, args, rid = request["op"], request.get("args", {}), request["id"]
    if op == "echo":
        _reply({"id": rid, "ok": True, "result": {"echo": args, "pid": os.getpid()}})
    elif op == "sleep":
        time.sleep(float(args.get("s", 0)))
        _reply({"id": rid, "ok": True, "result": {"slept": args.get("s", 0)}})
    elif op == "exit":
        os._exit(3)
    elif op == "whoami":
        who = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "sid": os.getsid(0),
            "cwd": os.getcwd(),
            "worker": os.environ.get("FENCECHECK_WORKER_ID"),
        }
        _reply({"id": rid, "ok": True, "result": who})
    else:
        _reply({"id": rid, "ok": False, "error": "Unsupported", "message": op})


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["fork-server"]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
        from reference_impl import fork_server

        return fork_server.serve(main, lambda: None)
    if args[:1] == ["exit-with"]:
        return int(args[1])
    if args[:1] != ["ops"]:
        print(f"usage: ops_worker.py ops (got {args})", file=sys.stderr)
        return 2
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("async"):
            threading.Thread(target=_serve, args=(request,), daemon=True).start()
        else:
            _serve(request)
    return 0


if __name__ == "__main__":
    sys.exit(main())

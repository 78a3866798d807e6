"""A tiny `ops`-mode worker for the channel tests (contract section 5).

Ops: `echo` returns its args; `sleep` sleeps `args.s` seconds then answers;
`exit` exits at once without answering; anything else is Unsupported.
Requests flagged `"async": true` run on their own thread.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
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
    else:
        _reply({"id": rid, "ok": False, "error": "Unsupported", "message": op})


def main() -> int:
    if sys.argv[1:2] != ["ops"]:
        print(f"usage: ops_worker.py ops (got {sys.argv[1:]})", file=sys.stderr)
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

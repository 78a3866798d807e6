"""``python -m harness.mutation.traced_worker <mode> ...``: the reference worker,
recording which of its functions ran.

The baseline of ``mutants --auto`` runs the matrix with this command instead of
``python -m reference_impl.worker`` (:mod:`.reach`): a Python mutant changes
one function, so only the experiments whose processes called it can catch it.
The trace starts before the package is imported, so a function that runs only
at import time counts too, and each new function is appended to
``FENCECHECK_CALLS_FILE`` (``<file>:<qualified name>`` per line, the file
relative to the package's parent) the moment it first runs: a worker the
experiment kills with SIGKILL has written all it ran.

Standard library only until the worker's own import, and never mutated: it is
harness code, not the implementation under test. The trace is a global
``sys.settrace`` hook that returns None, so Python calls it once per new frame
and never per line; the worker is started by exec (no fork server), since a
forked child would not see what its server imported.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

CALLS_FILE_ENV = "FENCECHECK_CALLS_FILE"
PACKAGE = "reference_impl"
TRACED_WORKER_CMD = (sys.executable, "-m", "harness.mutation.traced_worker")


def scope_of(qualname: str) -> str:
    """A code object's qualified name as mutant ids name scopes: without the
    ``<locals>`` of nested functions (``outer.<locals>.inner`` -> ``outer.inner``)."""
    return ".".join(part for part in qualname.split(".") if part != "<locals>")


def install(path: str) -> None:
    """Append each function of the package that runs, once, to ``path``."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        return
    package_dir = os.path.dirname(spec.origin)
    parent = os.path.dirname(package_dir)
    prefix = package_dir + os.sep
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    seen: set[CodeType] = set()
    lock = threading.Lock()

    def trace(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        code = frame.f_code
        if code in seen:
            return None
        with lock:
            if code not in seen:
                seen.add(code)
                if code.co_filename.startswith(prefix):
                    name = os.path.relpath(code.co_filename, parent)
                    # One small O_APPEND write per line: lines of concurrent
                    # processes never interleave.
                    os.write(fd, f"{name}:{scope_of(code.co_qualname)}\n".encode())
        return None

    threading.settrace(trace)
    sys.settrace(trace)


def main() -> int:
    path = os.environ.get(CALLS_FILE_ENV)
    if path:
        install(path)
    from reference_impl.worker import main as worker_main

    return worker_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())

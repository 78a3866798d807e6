"""``fencecheck-worker fork-server``: start workers by fork from an imported process.

The optional mode of worker contract §1. Importing psycopg and this package
costs about 0.25 s of CPU per process; a harness that starts 150 workers a
run pays it 150 times. In this mode the worker imports everything once, then
forks one child per request of the harness; each child is a worker exactly
as if it had been started with ``<worker-cmd> <mode> <args>``, in its own
session, with the environment, directory and standard streams of the
request, and it dies with this process.

This process stays single-threaded (fork is only safe there) and never opens
a connection, so a child starts from imported modules and nothing else.
Its standard input is a ``SOCK_SEQPACKET`` socket; the messages are in
docs/worker-contract.md §1.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import ctypes
import gc
import io
import json
import os
import select
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Sequence

MAX_MESSAGE = 1 << 20
_PR_SET_PDEATHSIG = 1


def serve(main: Callable[[Sequence[str]], int], warm: Callable[[], None]) -> int:
    """Serve spawn requests on stdin until it closes; ``main`` runs in each child."""
    warm()
    # Everything imported goes to the collector's permanent generation: a
    # child's collections then never walk (and write to) the objects it
    # shares with this process, so far fewer pages are copied on write.
    gc.freeze()
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: None)
    children: dict[int, int] = {}  # pid -> spawn id
    _send(sock, {"ready": True, "pid": os.getpid()})
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [], 1.0)
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                signum = os.read(wake_r, 64)
                if signal.SIGTERM in signum:
                    break
        _reap(sock, children)
        if sock.fileno() not in readable:
            continue
        try:
            data, ancdata, _flags, _addr = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(64))
        except OSError:
            break
        if not data:
            break
        fds = _fds_of(ancdata)
        try:
            request = json.loads(data)
            spawn_id = request["spawn"]
        except (ValueError, KeyError, TypeError):
            _close_all(fds)
            continue
        if len(fds) != 3:
            _close_all(fds)
            _send(sock, {"spawned": spawn_id, "error": f"expected 3 descriptors, got {len(fds)}"})
            continue
        gc.freeze()  # what this loop allocated since, too
        pid = os.fork()
        if pid == 0:
            _child(sock, wake_r, wake_w, fds, request, main)  # never returns
        _close_all(fds)
        children[pid] = spawn_id
        _send(sock, {"spawned": spawn_id, "pid": pid})
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return 0


def _send(sock: socket.socket, message: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        sock.send(json.dumps(message).encode())


def _fds_of(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
            fds.extend(arr)
    return fds


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _reap(sock: socket.socket, children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        spawn_id = children.pop(pid, None)
        _send(
            sock,
            {"exited": spawn_id, "pid": pid, "status": os.waitstatus_to_exitcode(status)},
        )


def _die_with(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _child(
    sock: socket.socket,
    wake_r: int,
    wake_w: int,
    fds: list[int],
    request: dict[str, object],
    main: Callable[[Sequence[str]], int],
) -> None:
    """Become the requested worker: session, parent-death signal, streams,
    environment, directory; run ``main``; exit with its status."""
    code = 1
    try:
        parent = os.getppid()
        os.setsid()
        _die_with(parent)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        sock.close()
        os.close(wake_r)
        os.close(wake_w)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        _close_all([fd for fd in fds if fd > 2])
        env = request.get("env")
        if isinstance(env, dict):
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in env.items()})
        cwd = request.get("cwd")
        if isinstance(cwd, str):
            os.chdir(cwd)
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        # The streams a fresh interpreter would have made on these descriptors
        # (they live as long as the process: no context manager).
        sys.stdin = io.TextIOWrapper(
            open(0, "rb", closefd=False),  # noqa: SIM115
            encoding="utf-8",
        )
        sys.stdout = io.TextIOWrapper(
            open(1, "wb", buffering=0 if unbuffered else -1, closefd=False),  # noqa: SIM115
            encoding="utf-8",
            line_buffering=True,
            write_through=unbuffered,
        )
        sys.stderr = io.TextIOWrapper(
            open(2, "wb", buffering=0, closefd=False),  # noqa: SIM115
            encoding="utf-8",
            errors="backslashreplace",
            write_through=True,
        )
        args = request.get("args")
        argv = [str(a) for a in args] if isinstance(args, list) else []
        sys.argv = [sys.argv[0], *argv]
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
        code = 1
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)

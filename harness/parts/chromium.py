"""Headless Chromium driven over the DevTools protocol on a pipe.

Used to prove the pages render in a real browser (tests) and to measure
them (``python -m harness.evidence.html.bench``). The protocol runs over
``--remote-debugging-pipe`` (fd 3 in, fd 4 out, NUL-separated JSON), so no
TCP port is opened and nothing but this process can talk to the browser.

Invariants:
- The browser runs in its own session with a fresh ``--user-data-dir`` and
  the flags that stop it from reaching for the network (this machine's
  network is closed; otherwise it retries connections); it gets a
  parent-death signal, and ``close()`` (also on error) kills its whole
  process group, reaps it and removes the profile: nothing is left behind.
- Every call waits at most its timeout and says what it waited for.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from harness.parts.processes import pdeathsig_preexec
from harness.waiting import wait_for

INSTALL_HINT = (
    "headless Chromium is needed: `make browser` installs Debian's `chromium` package "
    "(as root: apt-get install -y chromium), or set FENCECHECK_CHROMIUM to a Chromium binary"
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--metrics-recording-only",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


class ChromiumNotFound(RuntimeError):
    """No Chromium binary; the message says how to get one."""


class ChromiumError(RuntimeError):
    """The browser answered a call with an error, died, or did not answer in time."""


def find_chromium() -> str:
    """$FENCECHECK_CHROMIUM, then Debian's binary behind its launcher script,
    then ``chromium``/``chromium-browser`` on PATH."""
    explicit = os.environ.get("FENCECHECK_CHROMIUM")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise ChromiumNotFound(f"FENCECHECK_CHROMIUM={explicit} is not an executable file")
        return explicit
    # The launcher script execs this; starting it directly keeps the pid ours.
    for candidate in ("/usr/lib/chromium/chromium",):
        if os.access(candidate, os.X_OK):
            return candidate
    for name in ("chromium", "chromium-browser"):
        if found := shutil.which(name):
            return found
    raise ChromiumNotFound(INSTALL_HINT)


@dataclass
class PageLoad:
    """One page as the browser loaded it."""

    url: str
    load_ms: float
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)


class Chromium:
    """One headless browser; use as a context manager."""

    def __init__(self, binary: str | None = None, *, timeout_s: float = 30.0) -> None:
        self.binary = binary or find_chromium()
        self.timeout_s = timeout_s
        self._profile = Path(tempfile.mkdtemp(prefix="fencecheck-chromium-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._to_browser: int | None = None
        self._from_browser: int | None = None
        self._next_id = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._replies: dict[int, dict[str, Any]] = {}
        self._events: list[dict[str, Any]] = []
        self._reader: threading.Thread | None = None
        self._dead: str | None = None

    # ------------------------------------------------------------- lifecycle
    def start(self) -> Self:
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        deathsig = pdeathsig_preexec(os.getpid())

        def preexec() -> None:
            deathsig()
            # Onto fds 3 and 4 via copies at 10+ so neither clobbers the other.
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        argv = [self.binary, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"]
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Python's own fds are not inheritable (PEP 446): only 3 and 4 pass.
                close_fds=False,
                preexec_fn=preexec,
                start_new_session=True,
            )
        except OSError as exc:
            raise ChromiumNotFound(f"cannot start {self.binary}: {exc}; {INSTALL_HINT}") from exc
        finally:
            os.close(to_browser_r)
            os.close(from_browser_w)
        self._to_browser, self._from_browser = to_browser_w, from_browser_r
        self._reader = threading.Thread(target=self._read, name="chromium-cdp", daemon=True)
        self._reader.start()
        self.call("Browser.getVersion")
        return self

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Ask the browser to close, then kill its process group and reap it."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ChromiumError, OSError):
                self.call("Browser.close", timeout_s=3.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=3.0)
        if proc is not None:
            # Renderers and helpers live in the browser's session group.
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
                if not _group_alive(proc.pid):
                    break
                with contextlib.suppress(TimeoutError):
                    wait_for(
                        lambda: not _group_alive(proc.pid) or None,
                        what=f"chromium process group {proc.pid} to exit",
                        timeout_s=3.0,
                    )
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=3.0)
        for fd in (self._to_browser, self._from_browser):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._to_browser = self._from_browser = None
        shutil.rmtree(self._profile, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # ------------------------------------------------------------- protocol
    def _read(self) -> None:
        buffer = b""
        fd = self._from_browser
        assert fd is not None
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._dead = "the browser closed its DevTools pipe (it exited)"
                    self._cond.notify_all()
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            with self._cond:
                for raw in messages:
                    msg = json.loads(raw)
                    if "id" in msg:
                        self._replies[int(msg["id"])] = msg
                    else:
                        self._events.append(msg)
                self._cond.notify_all()

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """One DevTools call; its result, or ChromiumError with the browser's message."""
        with self._cond:
            self._next_id += 1
            call_id = self._next_id
        message: dict[str, Any] = {"id": call_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        if self._to_browser is None:
            raise ChromiumError(f"{method}: the browser is not running")
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        with self._cond:
            while call_id not in self._replies:
                left = deadline - time.monotonic()
                if self._dead:
                    raise ChromiumError(f"{method}: {self._dead}")
                if left <= 0:
                    raise ChromiumError(
                        f"{method}: no answer within {timeout_s or self.timeout_s}s"
                    )
                self._cond.wait(left)
            reply = self._replies.pop(call_id)
        if "error" in reply:
            raise ChromiumError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def events(self, session: str, *, since: int = 0) -> list[dict[str, Any]]:
        """The session's events from the ``since``-th event the browser sent on."""
        with self._cond:
            return [e for e in self._events[since:] if e.get("sessionId") == session]

    def wait_event(
        self, session: str, method: str, *, since: int = 0, timeout_s: float | None = None
    ) -> dict[str, Any]:
        timeout = timeout_s or self.timeout_s
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                seen = [
                    e
                    for e in self._events[since:]
                    if e.get("sessionId") == session and e.get("method") == method
                ]
                if seen:
                    return seen[0]
                left = deadline - time.monotonic()
                if self._dead:
                    raise ChromiumError(f"waiting for {method}: {self._dead}")
                if left <= 0:
                    raise ChromiumError(f"no {method} event within {timeout}s")
                self._cond.wait(left)

    def event_count(self) -> int:
        with self._cond:
            return len(self._events)

    # ------------------------------------------------------------- pages
    def new_page(self, *, width: int = 1280, height: int = 900, offline: bool = True) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=session)
        if offline:
            self.call(
                "Network.emulateNetworkConditions",
                {"offline": True, "latency": 0, "downloadThroughput": 0, "uploadThroughput": 0},
                session=session,
            )
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        return Page(self, target, session)


class Page:
    """One tab: load a URL, evaluate in it, take screenshots."""

    def __init__(self, browser: Chromium, target: str, session: str) -> None:
        self.browser = browser
        self.target = target
        self.session = session

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, session=self.session)

    def load(self, url: str) -> PageLoad:
        """Navigate and wait for the load event; console errors, requests and
        failed requests seen while loading come back with it."""
        first = self.browser.event_count()
        started = time.perf_counter()
        nav = self.call("Page.navigate", {"url": url})
        if nav.get("errorText"):
            raise ChromiumError(f"cannot open {url}: {nav['errorText']}")
        self.browser.wait_event(self.session, "Page.loadEventFired", since=first)
        wall_ms = 1000 * (time.perf_counter() - started)
        events = self.browser.events(self.session, since=first)
        result = PageLoad(url=url, load_ms=wall_ms)
        for e in events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                result.console_errors.append(str(p.get("exceptionDetails", {}).get("text")))
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                result.console_errors.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", []))
                )
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                result.console_errors.append(str(p["entry"].get("text")))
            elif method == "Network.requestWillBeSent":
                result.requests.append(str(p.get("request", {}).get("url")))
            elif method == "Network.loadingFailed":
                result.failed_requests.append(f"{p.get('errorText')} ({p.get('requestId')})")
        return result

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` evaluated in the page."""
        reply = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if reply.get("exceptionDetails"):
            raise ChromiumError(f"evaluate failed: {reply['exceptionDetails']}")
        return reply.get("result", {}).get("value")

    def timing(self) -> dict[str, float]:
        """The page's own navigation timing (ms since navigation start)."""
        value = self.evaluate(
            "(() => { const n = performance.getEntriesByType('navigation')[0];"
            " const p = performance.getEntriesByName('first-contentful-paint')[0];"
            " return {dom_content_loaded: n.domContentLoadedEventEnd, load: n.loadEventEnd,"
            " first_contentful_paint: p ? p.startTime : -1, transfer_bytes: n.transferSize,"
            " decoded_bytes: n.decodedBodySize}; })()"
        )
        return {k: float(v) for k, v in (value or {}).items()}

    def screenshot(
        self,
        path: Path,
        *,
        top: float = 0.0,
        bottom: float | None = None,
        max_height: int = 12000,
    ) -> Path:
        """A PNG of the page from ``top`` to ``bottom`` (default: the end of the
        document), at most ``max_height`` pixels tall."""
        metrics = self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
        end = float(size.get("height", 900)) if bottom is None else bottom
        clip = {
            "x": 0,
            "y": top,
            "width": float(size.get("width", 1280)),
            "height": min(end - top, float(max_height)),
            "scale": 1,
        }
        params = {"format": "png", "captureBeyondViewport": True, "clip": clip}
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", params)["data"]))
        return path

    def close(self) -> None:
        with contextlib.suppress(ChromiumError):
            self.browser.call("Target.closeTarget", {"targetId": self.target})


def group_members(pgid: int) -> list[int]:
    """Live pids of process group ``pgid`` (zombies count as gone)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command name: fields[0] is the state, fields[2] the group.
        if fields[2] == str(pgid) and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))

"""A real part that failed, said in one paragraph a person can act on.

The exit-code contract (README, "Exit codes") makes a harness or environment
error exit 2 with one paragraph: what failed, its exit status, the last lines
of its stderr, and where the full log is. :class:`PartFailed` carries exactly
that, so the command line prints it as it is, without a traceback.
"""

from __future__ import annotations

from pathlib import Path

TAIL_LINES = 8


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` non-empty lines of ``text``, indented for a paragraph."""
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n".join(f"    {line}" for line in kept) if kept else "    (nothing)"


def file_tail(path: Path | None, lines: int = TAIL_LINES) -> str:
    if path is None:
        return tail("")
    try:
        data = path.read_bytes()[-8192:]
    except OSError:
        return "    (no log)"
    return tail(data.decode("utf-8", errors="replace"), lines)


class PartFailed(RuntimeError):
    """A server, tool or worker command failed to start or to do its job."""

    def __init__(
        self,
        what: str,
        *,
        status: str,
        stderr: str,
        log: Path | None,
        hint: str = "",
    ) -> None:
        self.what = what
        self.status = status
        self.stderr = stderr
        self.log = log
        self.hint = hint
        where = f"full log: {log}" if log is not None else "no log was kept"
        super().__init__(
            f"{what} ({status}); last lines of its stderr:\n{tail(stderr)}\n  {where}"
            + (f"\n  {hint}" if hint else "")
        )

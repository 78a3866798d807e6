"""Three-valued verdicts, as in Jepsen: pass, fail, unknown.

``unknown`` means the experiment proved nothing either way: its fault did not
take effect, the worker lacks an operation the experiment needs, or the
harness itself failed. It is never counted as a pass.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"

    @staticmethod
    def merge(verdicts: Iterable[Verdict]) -> Verdict:
        """Fail beats unknown beats pass; no verdicts at all is unknown."""
        seen = set(verdicts)
        if not seen:
            return Verdict.UNKNOWN
        if Verdict.FAIL in seen:
            return Verdict.FAIL
        if Verdict.UNKNOWN in seen:
            return Verdict.UNKNOWN
        return Verdict.PASS


#: How long a verdict's reason may be wherever a person reads it among others
#: (console, summary, JUnit message, results.json, index pages): one line.
REASON_CHARS = 200


def reason_line(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters: every run of
    whitespace (line breaks included: an SQL error's context lines, a
    traceback) becomes one space, and a longer text is cut at a word with an
    ellipsis. The archive keeps the whole text; this is what a list shows."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


# Process exit codes of `fencecheck run`: a CI gate reads these.
EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_UNKNOWN = 2
EXIT_USAGE = 64


def exit_code(verdict: Verdict) -> int:
    return {Verdict.PASS: EXIT_PASS, Verdict.FAIL: EXIT_FAIL, Verdict.UNKNOWN: EXIT_UNKNOWN}[
        verdict
    ]

"""Verdicts as in Jepsen (pass, fail, unknown), and a fourth: not applicable.

``unknown`` means the experiment proved nothing either way: its fault did not
take effect, the worker lacks an operation the experiment needs without
having said so, or the harness itself failed. It is never counted as a pass.

``not_applicable`` means the system declared (in its mapping) that it lacks
an optional capability or injection point the experiment needs, so the
experiment was not run: shown apart, counted neither as a pass nor against
the gate (unless ``--fail-on not_applicable``). A capability the protocol
needs for safety (the fencing token) is never a reason for it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"
    NOT_APPLICABLE = "not_applicable"

    @property
    def words(self) -> str:
        """The verdict as a person reads it (``not applicable``)."""
        return self.value.replace("_", " ")

    @staticmethod
    def merge(verdicts: Iterable[Verdict]) -> Verdict:
        """Fail beats unknown beats pass beats not applicable; no verdicts at all
        is unknown (nothing was proven), only not applicable ones not applicable."""
        seen = set(verdicts)
        if not seen:
            return Verdict.UNKNOWN
        if Verdict.FAIL in seen:
            return Verdict.FAIL
        if Verdict.UNKNOWN in seen:
            return Verdict.UNKNOWN
        if Verdict.PASS in seen:
            return Verdict.PASS
        return Verdict.NOT_APPLICABLE


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
    return {
        Verdict.PASS: EXIT_PASS,
        Verdict.FAIL: EXIT_FAIL,
        Verdict.UNKNOWN: EXIT_UNKNOWN,
        Verdict.NOT_APPLICABLE: EXIT_PASS,
    }[verdict]

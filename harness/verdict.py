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


# Process exit codes of `fencecheck run`: a CI gate reads these.
EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_UNKNOWN = 2
EXIT_USAGE = 64


def exit_code(verdict: Verdict) -> int:
    return {Verdict.PASS: EXIT_PASS, Verdict.FAIL: EXIT_FAIL, Verdict.UNKNOWN: EXIT_UNKNOWN}[
        verdict
    ]

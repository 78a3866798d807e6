"""The functions a PostgreSQL server's log names in the context of an error.

The server counts a function's call (``pg_stat_user_functions``) only when it
returns; one that raised is missing there, but the error it raised is in the
server's log with a CONTEXT line per frame. The reach of generated mutants
(harness/mutation/reach.py) reads those so that a function whose every call
in an experiment was refused still counts as reached.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A log line under the harness's log_line_prefix ('%m [%p] %a %u@%d '): the
# first line of an error's context; its outer frames follow on lines that
# begin with a tab and carry no prefix.
_CONTEXT = re.compile(r"^\S+ \S+ \S+ \[\d+\] .*?@(?P<db>\S+) CONTEXT:\s+(?P<text>.*)$")
# A frame: `PL/pgSQL function fencecheck.renew(uuid,bigint) line 7 at RAISE`,
# `SQL function "claim_next" statement 1`.
_FRAME = re.compile(r'(?:PL/pgSQL function |SQL function ")(?P<name>[\w.]+)')


def functions_in_error_context(log_lines: Iterable[str], dbname: str) -> frozenset[str]:
    """Every function name (``schema.function``, or bare where the server left
    the schema out) in the context of an error logged for database ``dbname``."""
    named: set[str] = set()
    in_context = False
    for line in log_lines:
        match = _CONTEXT.match(line)
        if match is not None:
            in_context = match["db"] == dbname
            text = match["text"]
        elif in_context and line.startswith("\t"):
            text = line
        else:
            in_context = False
            continue
        if in_context:
            named.update(frame["name"] for frame in _FRAME.finditer(text))
    return frozenset(named)

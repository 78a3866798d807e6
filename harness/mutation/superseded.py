"""Function bodies of a migration that a later migration replaces before anything runs them.

A migration is history: once applied it never changes (its checksum is
checked), so a function rewritten later is rewritten by a later migration
with ``CREATE OR REPLACE FUNCTION`` and the earlier body stays in its file.
That body is dead code on every database the migrations build: the
replacement takes its place (same name, same parameters) before any worker
connects. A mutant of it cannot act, and judging one costs a matrix run to
learn nothing, so the generator leaves such bodies out (as it leaves out
``001_roles.sql``).

A body counts as replaced only when nothing could have run it in between:
no top-level statement from its end to the replacement (DO blocks
included) names the function, and for a trigger function no top-level
statement between writes a table at all. Anything else keeps it.

Invariant: a body is reported only when a later ``CREATE OR REPLACE
FUNCTION`` of the same schema-qualified name has the same parameter list
(PostgreSQL replaces only an identical signature; a different one is an
overload that lives beside it, and an ``ALTER FUNCTION .. RENAME`` keeps the
body alive under a new name, so neither is reported).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from harness.mutation.sql_tokens import Token, significant, tokenize

_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE|COPY|MERGE|TRUNCATE)\b", re.I)


@dataclass(frozen=True)
class Definition:
    """One ``CREATE [OR REPLACE] FUNCTION`` of a migration file."""

    path: str
    name: str  # schema-qualified, as written
    params: str  # the parameter list, whitespace squeezed, upper-cased
    replaces: bool  # OR REPLACE
    trigger: bool  # RETURNS trigger
    start: int  # offset of CREATE
    body_start: int
    body_end: int
    end: int  # offset after the statement's closing token


@dataclass(frozen=True)
class Superseded:
    """A definition whose body never runs, and what replaced it."""

    definition: Definition
    by_path: str
    by_line: int

    @property
    def reason(self) -> str:
        return (
            f"{self.definition.name} is replaced by {self.by_path}:{self.by_line} "
            "(CREATE OR REPLACE, same parameters) before anything runs it"
        )


def definitions(path: str, text: str) -> list[Definition]:
    """Every function definition of one migration file, in file order."""
    sig = significant(tokenize(text, path))
    found: list[Definition] = []
    i = 0
    while i < len(sig):
        if sig[i].upper != "FUNCTION" or i == 0 or sig[i - 1].upper not in ("CREATE", "REPLACE"):
            i += 1
            continue
        replaces = sig[i - 1].upper == "REPLACE"
        create = i - 3 if replaces else i - 1
        j = i + 1
        name = [sig[j].text]
        while j + 2 < len(sig) and sig[j + 1].text == "." and sig[j + 2].kind == "ident":
            name.append(sig[j + 2].text)
            j += 2
        open_paren = j + 1
        close_paren = _matching(sig, open_paren)
        params = " ".join(t.text.upper() for t in sig[open_paren + 1 : close_paren])
        opening = next((k for k in range(close_paren, len(sig)) if sig[k].kind == "dollar"), None)
        if opening is None:
            i = close_paren + 1
            continue
        closing = next(
            k
            for k in range(opening + 1, len(sig))
            if sig[k].kind == "dollar" and sig[k].text == sig[opening].text
        )
        returns = [t.upper for t in sig[close_paren + 1 : opening]]
        end = next((k for k in range(closing, len(sig)) if sig[k].text == ";"), len(sig) - 1)
        found.append(
            Definition(
                path=path,
                name=".".join(name),
                params=params,
                replaces=replaces,
                trigger="RETURNS" in returns and "TRIGGER" in returns,
                start=sig[max(create, 0)].start,
                body_start=sig[opening].end,
                body_end=sig[closing].start,
                end=sig[end].end,
            )
        )
        i = end + 1
    return found


def _matching(sig: list[Token], opening: int) -> int:
    level = 0
    for k in range(opening, len(sig)):
        if sig[k].text == "(":
            level += 1
        elif sig[k].text == ")":
            level -= 1
            if level == 0:
                return k
    raise ValueError(f"unbalanced parameter list at offset {sig[opening].start}")


def superseded(migrations: Sequence[tuple[str, str]]) -> list[Superseded]:
    """The dead definitions among ``migrations`` ((path, text) in the order they apply)."""
    defs = [d for path, text in migrations for d in definitions(path, text)]
    texts = dict(migrations)
    order = [path for path, _ in migrations]
    dead: list[Superseded] = []
    for n, d in enumerate(defs):
        replacement = next(
            (
                r
                for r in defs[n + 1 :]
                if r.replaces and r.name.lower() == d.name.lower() and r.params == d.params
            ),
            None,
        )
        if replacement is None:
            continue
        between = _top_level_between(d, replacement, defs, texts, order)
        bare = d.name.rsplit(".", 1)[-1]
        if re.search(rf"\b{re.escape(bare)}\b", between, re.I) and not _only_granted(between, bare):
            continue
        if d.trigger and _WRITES.search(between):
            continue
        line = texts[replacement.path].count("\n", 0, replacement.start) + 1
        dead.append(Superseded(d, replacement.path, line))
    return dead


# Statements that name or define without running a function: dynamic SQL
# that sets owners, grants or row policies (whose expressions would name any
# function they call), and a trigger's binding (``EXECUTE FUNCTION f()``,
# which names f unquoted).
_NOT_CALLING = re.compile(
    r"EXECUTE\s+(FUNCTION|PROCEDURE|ON)\b|EXECUTE\s+format\s*\(\s*'\s*"
    r"(ALTER\s+FUNCTION\s+%s\s+OWNER\s+TO|REVOKE|GRANT|DROP\s+POLICY|CREATE\s+POLICY)\b",
    re.I,
)


def _only_granted(between: str, bare: str) -> bool:
    """True when the code between names the function only as a quoted name
    (``'record_tool_result'`` in 010_function_grants.sql's lists of names)
    and no ``EXECUTE`` there can run it: each one sets owners, grants or
    policies, or binds a trigger. A mention outside quotes, or any other
    ``EXECUTE`` (which could call a function by a name built at run time),
    keeps the body alive."""
    quoted_only = all(
        m.group(1) == "'" and m.group(2) == "'"
        for m in re.finditer(rf"(.)\b{re.escape(bare)}\b(.)", between, re.I | re.S)
    )
    executes = len(re.findall(r"\bEXECUTE\b", between, re.I))
    return quoted_only and executes == len(_NOT_CALLING.findall(between))


def _top_level_between(
    first: Definition,
    last: Definition,
    defs: Sequence[Definition],
    texts: dict[str, str],
    order: Sequence[str],
) -> str:
    """The code that executes between the end of ``first`` and the start of
    ``last``: every migration's tokens in that span, comments and function
    bodies left out (a body only runs when called, and a call would name it
    at top level); string literals kept (EXECUTE runs them)."""
    kept: list[str] = []
    for path in order[order.index(first.path) : order.index(last.path) + 1]:
        text = texts[path]
        lo = first.end if path == first.path else 0
        hi = last.start if path == last.path else len(text)
        bodies = [(d.body_start, d.body_end) for d in defs if d.path == path]
        kept.extend(
            t.text
            for t in significant(tokenize(text, path))
            if lo <= t.start < hi and not any(s <= t.start < e for s, e in bodies)
        )
    return " ".join(kept)

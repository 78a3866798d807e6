"""Mutation sites in the protocol's SQL: function bodies, DO blocks, named statements.

Where: the body of every ``CREATE FUNCTION`` and ``DO`` block of a migration,
and every named statement of ``sql/queries``. Table, index and constraint
DDL is left alone: its constraints are ones the protocol's functions never
violate (weakening one cannot be observed, strengthening one only breaks
setup) and index predicates only choose access paths.

Operators (each one edit, each a plausible single mistake):

| operator | change |
|---|---|
| ``drop_conjunct`` / ``drop_disjunct`` | one term of an AND / OR condition (WHERE, JOIN ON, IF, ELSIF, WHEN) removed |
| ``drop_where`` | a WHERE with a single condition removed |
| ``negate_compare`` | ``=``/``<>``, ``<``/``>=``, ``>``/``<=``, ``IS [NOT] NULL``, ``IS [NOT] DISTINCT FROM``, ``[NOT] IN`` |
| ``drop_not`` | a boolean ``NOT`` removed (``NOT FOUND``, ``NOT EXISTS``, ``NOT v``) |
| ``and_or`` | ``AND`` <-> ``OR`` |
| ``clock_to_now`` | ``clock_timestamp()`` -> ``now()`` (the time stored at transaction start) where time is judged: an operand of a comparison, or assigned to a variable |
| ``drop_lock`` | ``FOR UPDATE [OF ..] [SKIP LOCKED]`` removed |
| ``drop_skip_locked`` | ``SKIP LOCKED`` removed (the statement waits instead) |
| ``raise_noop`` | ``RAISE EXCEPTION ...`` -> ``NULL`` |
| ``drop_increment`` | ``x + 1`` -> ``x`` |
| ``drop_statement`` | one INSERT / UPDATE / DELETE / PERFORM statement of a PL/pgSQL body -> ``NULL`` |

Invariant: every site edits tokens of one body or statement only, and never
the inside of a string literal or a comment.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from harness.mutation.sites import Edit, Site
from harness.mutation.sql_tokens import Token, significant, tokenize

_NEGATED = {"=": "<>", "<>": "=", "!=": "=", "<": ">=", ">": "<=", "<=": ">", ">=": "<"}
_COMPARISONS = frozenset(_NEGATED)
_WHERE_ENDS = frozenset(
    {"RETURNING", "ORDER", "GROUP", "HAVING", "LIMIT", "OFFSET", "FOR", "UNION", "LOOP", "INTO"}
    | {"WINDOW", "THEN", "DO", "EXCEPT", "INTERSECT"}
)
_ON_ENDS = _WHERE_ENDS | {"WHERE", "JOIN", "LEFT", "RIGHT", "INNER", "FULL", "CROSS"}
_STATEMENT_STARTS = frozenset({";", "BEGIN", "THEN", "ELSE", "LOOP", "DECLARE"})
_RAISE_QUIET_LEVELS = frozenset({"DEBUG", "LOG", "INFO", "NOTICE", "WARNING"})
# Words that may precede "(" without being a function name.
_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "WHERE", "IF", "ELSIF", "WHEN", "IN", "EXISTS", "THEN", "ON", "SELECT"}
    | {"AS", "RETURN", "CASE", "ELSE", "USING", "VALUES", "FROM", "ALL", "ANY", "ARRAY"}
)
_HEADER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.M)


@dataclass(frozen=True)
class Body:
    """One place code lives: a function body, a DO block or a named statement."""

    scope: str
    start: int
    end: int
    plpgsql: bool


def migration_bodies(text: str, tokens: list[Token]) -> list[Body]:
    """Function bodies and DO blocks of a migration file, in file order."""
    sig = significant(tokens)
    bodies: list[Body] = []
    do_blocks = 0
    i = 0
    while i < len(sig):
        t = sig[i]
        if t.upper == "FUNCTION" and i > 0 and sig[i - 1].upper in ("CREATE", "REPLACE"):
            name = _qualified_name(sig, i + 1)
            opening = _next_dollar(sig, i)
            if opening is None:
                i += 1
                continue
            closing = _matching_dollar(sig, opening)
            language = _language(sig, i, closing)
            bodies.append(
                Body(name, sig[opening].end, sig[closing].start, plpgsql=language == "PLPGSQL")
            )
            i = closing + 1
            continue
        if t.upper == "DO" and i + 1 < len(sig) and sig[i + 1].kind == "dollar":
            do_blocks += 1
            closing = _matching_dollar(sig, i + 1)
            bodies.append(Body(f"do_block_{do_blocks}", sig[i + 1].end, sig[closing].start, True))
            i = closing + 1
            continue
        i += 1
    return bodies


def query_bodies(text: str) -> list[Body]:
    """The named statements of a ``sql/queries`` file (``-- name:`` headers)."""
    headers = list(_HEADER.finditer(text))
    return [
        Body(
            f"query.{h.group(1)}",
            h.end(),
            headers[k + 1].start() if k + 1 < len(headers) else len(text),
            plpgsql=False,
        )
        for k, h in enumerate(headers)
    ]


def _qualified_name(sig: list[Token], i: int) -> str:
    parts = [sig[i].text]
    while i + 2 < len(sig) and sig[i + 1].text == "." and sig[i + 2].kind == "ident":
        parts.append(sig[i + 2].text)
        i += 2
    return ".".join(parts)


def _next_dollar(sig: list[Token], i: int) -> int | None:
    for j in range(i, len(sig)):
        if sig[j].kind == "dollar":
            return j
        if sig[j].text == ";":
            return None
    return None


def _matching_dollar(sig: list[Token], opening: int) -> int:
    for j in range(opening + 1, len(sig)):
        if sig[j].kind == "dollar" and sig[j].text == sig[opening].text:
            return j
    raise ValueError(
        f"unterminated dollar quote {sig[opening].text} at offset {sig[opening].start}"
    )


def _language(sig: list[Token], start: int, end: int) -> str:
    # LANGUAGE may stand before AS $$ or after the closing $$.
    for j in [*range(start, end), *range(end + 1, min(end + 6, len(sig)))]:
        if sig[j].upper == "LANGUAGE" and j + 1 < len(sig):
            language: str = sig[j + 1].upper
            return language
        if j > end and sig[j].text == ";":
            break
    return ""


# --------------------------------------------------------------------- sites


class _BodySites:
    """Finds every site of one body. ``sig`` are its significant tokens."""

    def __init__(self, text: str, body: Body, tokens: list[Token]) -> None:
        self.text = text
        self.body = body
        self.sig = [t for t in tokens if t.significant and body.start <= t.start < body.end]
        self.depth = _depths(self.sig)
        self.assignment_eq = self._assignment_equals()
        self.exception_when = self._exception_whens()

    # -------------------------------------------------------- helpers
    def up(self, i: int) -> str:
        return self.sig[i].upper if 0 <= i < len(self.sig) else ""

    def tx(self, i: int) -> str:
        return self.sig[i].text if 0 <= i < len(self.sig) else ""

    def site(self, operator: str, edits: list[Edit], first: int, last: int) -> Site:
        """A site whose snippet is tokens ``first..last`` (before and after the edits)."""
        original = self.text[self.sig[first].start : self.sig[last].end]
        replaced = _apply_local(self.text, self.sig[first].start, self.sig[last].end, edits)
        return Site(self.body.scope, operator, tuple(edits), original, replaced)

    def removal(self, operator: str, edit: Edit, first: int, last: int) -> Site:
        """A site that removes tokens ``first..last`` (its snippet is what goes)."""
        original = self.text[self.sig[first].start : self.sig[last].end]
        return Site(self.body.scope, operator, (edit,), original, "")

    def _closing_to_opening(self, j: int) -> int:
        pair = {")": "(", "]": "["}[self.tx(j)]
        level = 0
        for k in range(j, -1, -1):
            if self.tx(k) == self.tx(j):
                level += 1
            elif self.tx(k) == pair:
                level -= 1
                if level == 0:
                    return k
        return j

    def left_operand(self, i: int) -> int:
        """First token of the operand that ends at token ``i``."""
        j = i
        while j > 0:
            if self.tx(j) in (")", "]"):
                j = self._closing_to_opening(j)
                if self.sig[j - 1].kind == "ident" and self.up(j - 1) not in _KEYWORDS:
                    j -= 1
                    continue
                if self.tx(j) == "[":
                    j -= 1
                    continue
            if self.tx(j - 1) in (".", "::", "->>", "->") and j > 1:
                j -= 2
                continue
            break
        return j

    def right_operand(self, i: int) -> int:
        """Last token of the operand that starts at token ``i``."""
        j = i
        if self.sig[j].kind == "ident" and self.tx(j + 1) == "(" and self.up(j) not in _KEYWORDS:
            j += 1
        if self.tx(j) == "(":
            j = self._matching(j)
        while j + 2 < len(self.sig) and self.tx(j + 1) in (".", "::", "->>", "->", "["):
            if self.tx(j + 1) == "[":
                j = self._matching_bracket(j + 1)
                continue
            j += 2
            if self.tx(j + 1) == "(" and self.tx(j - 1) != "::":
                j = self._matching(j + 1)
        return j

    def _matching_bracket(self, i: int) -> int:
        for j in range(i, len(self.sig)):
            if self.tx(j) == "]":
                return j
        return i

    # -------------------------------------------------------- context
    def _assignment_equals(self) -> set[int]:
        """Indexes of ``=`` tokens that assign (UPDATE SET lists, RAISE USING
        options, GET DIAGNOSTICS), which are not comparisons."""
        out: set[int] = set()
        set_depth: int | None = None
        using = False
        for i, t in enumerate(self.sig):
            d = self.depth[i]
            if t.upper == "SET":
                set_depth = d
            elif (
                set_depth is not None
                and d == set_depth
                and (t.upper in ("WHERE", "FROM", "RETURNING") or t.text == ";")
            ):
                set_depth = None
            if t.upper == "USING" and self._in_raise(i):
                using = True
            elif t.text == ";":
                using = False
            if t.text != "=":
                continue
            before = self.up(i - 2) or self.tx(i - 2)
            in_set = set_depth is not None and d == set_depth and before in ("SET", ",")
            in_using = using and before in ("USING", ",")
            if in_set or in_using or before == "DIAGNOSTICS":
                out.add(i)
        return out

    def _in_raise(self, i: int) -> bool:
        for j in range(i - 1, -1, -1):
            if self.tx(j) == ";":
                return False
            if self.up(j) == "RAISE":
                return True
        return False

    def _exception_whens(self) -> set[int]:
        """WHEN tokens that name exception conditions (``EXCEPTION WHEN a OR b``)."""
        out: set[int] = set()
        handler = False
        for i, t in enumerate(self.sig):
            if t.upper == "EXCEPTION" and self.up(i - 1) != "RAISE":
                handler = True
            elif t.upper == "END" and self.up(i + 1) not in ("IF", "LOOP", "CASE"):
                handler = False
            elif t.upper == "WHEN" and handler:
                out.add(i)
        return out

    def _region_end(self, i: int, ends: frozenset[str]) -> int:
        """Last index of the condition that starts after keyword ``i``."""
        d = self.depth[i]
        j = i + 1
        while j < len(self.sig):
            t = self.sig[j]
            if self.depth[j] == d and (t.upper in ends or t.text == ";"):
                break
            if t.text == ")" and self.depth[j] == d:
                break
            j += 1
        return j - 1

    def conditions(self) -> Iterator[tuple[str, int, int]]:
        """(kind, first, last) of every condition: WHERE, JOIN ON, IF/ELSIF, WHEN."""
        for i, t in enumerate(self.sig):
            u = t.upper
            if u == "WHERE":
                yield "where", i + 1, self._region_end(i, _WHERE_ENDS)
            elif u in ("IF", "ELSIF") and self.up(i - 1) != "END":
                yield "if", i + 1, self._region_end(i, frozenset({"THEN"}))
            elif u == "WHEN" and i not in self.exception_when:
                yield "when", i + 1, self._region_end(i, frozenset({"THEN"}))
            elif u == "ON" and self.up(i + 1) != "CONFLICT" and self._after_join(i):
                yield "on", i + 1, self._region_end(i, _ON_ENDS)

    def _after_join(self, i: int) -> bool:
        for j in range(i - 1, -1, -1):
            if self.depth[j] < self.depth[i] or self.tx(j) == ";":
                return False
            if self.up(j) == "JOIN" and self.depth[j] == self.depth[i]:
                return True
        return False

    # -------------------------------------------------------- operators
    def all(self) -> Iterator[Site]:
        yield from self.dropped_terms()
        yield from self.negations()
        yield from self.dropped_nots()
        yield from self.and_or()
        yield from self.clock_to_now()
        yield from self.locks()
        yield from self.raises()
        yield from self.increments()
        if self.body.plpgsql:
            yield from self.statements()

    def dropped_terms(self) -> Iterator[Site]:
        for kind, first, last in self.conditions():
            if last < first:
                continue
            terms = self.terms(first, last)
            if len(terms) == 1 and kind == "where" and self._top_level(first, last):
                # The WHERE keyword and its one condition, with the space before.
                where = first - 1
                start = self.sig[where - 1].end if where > 0 else self.sig[where].start
                yield self.removal("drop_where", Edit(start, self.sig[last].end, ""), where, last)
            yield from self._drop_each(first, last)

    def _top_level(self, first: int, last: int) -> bool:
        return not (self.tx(first) == "(" and self._matching(first) == last)

    def _drop_each(self, first: int, last: int) -> Iterator[Site]:
        terms = self.terms(first, last)
        if len(terms) >= 2:
            op = self.up(terms[0][1] + 1)
            operator = "drop_conjunct" if op == "AND" else "drop_disjunct"
            for k, (a, b) in enumerate(terms):
                if k == 0:
                    edit = Edit(self.sig[a].start, self.sig[terms[1][0]].start, "")
                else:
                    edit = Edit(self.sig[terms[k - 1][1]].end, self.sig[b].end, "")
                yield self.removal(operator, edit, a, b)
        for a, b in terms:  # a parenthesized boolean term: its own terms too
            grouped = self.tx(a) == "(" and self._matching(a) == b and b - a > 2
            grouped = grouped and self.up(a + 1) not in ("SELECT", "WITH")  # a subquery
            if grouped and len(self.terms(a + 1, b - 1)) >= 2:
                yield from self._drop_each(a + 1, b - 1)

    def _matching(self, i: int) -> int:
        level = 0
        for j in range(i, len(self.sig)):
            if self.tx(j) == "(":
                level += 1
            elif self.tx(j) == ")":
                level -= 1
                if level == 0:
                    return j
        return -1

    def terms(self, first: int, last: int) -> list[tuple[int, int]]:
        """Top-level OR terms if there is an OR, else top-level AND terms."""
        d = self.depth[first]
        level = [
            j for j in range(first, last + 1) if self.depth[j] == d and self.tx(j) not in ("(", ")")
        ]
        if any(self.up(j) == "BETWEEN" for j in level):
            return [(first, last)]
        for sep in ("OR", "AND"):
            cuts = [j for j in level if self.up(j) == sep]
            if cuts:
                bounds = [first - 1, *cuts, last + 1]
                return [(bounds[k] + 1, bounds[k + 1] - 1) for k in range(len(bounds) - 1)]
        return [(first, last)]

    def negations(self) -> Iterator[Site]:
        for i, t in enumerate(self.sig):
            if t.kind == "op" and t.text in _COMPARISONS and i not in self.assignment_eq:
                edit = Edit(t.start, t.end, _NEGATED[t.text])
                first, last = self.left_operand(i - 1), self.right_operand(i + 1)
                yield self.site("negate_compare", [edit], first, last)
            elif t.upper == "IS":
                nxt = i + 1
                if self.up(nxt) == "NOT":
                    edit = Edit(self.sig[nxt].start, self.sig[nxt + 1].start, "")
                elif self.up(nxt) in ("NULL", "DISTINCT"):
                    edit = Edit(self.sig[nxt].start, self.sig[nxt].start, "NOT ")
                else:
                    continue
                last = nxt + 1 if self.up(nxt) == "NOT" else nxt
                if self.up(last) == "DISTINCT":
                    last = self.right_operand(last + 2)
                yield self.site("negate_compare", [edit], self.left_operand(i - 1), last)
            elif (
                t.upper == "IN"
                and self.tx(i + 1) == "("
                and self.up(i - 2) not in ("FOR", "FOREACH")
            ):
                if self.up(i - 1) == "NOT":
                    edit = Edit(self.sig[i - 1].start, t.start, "")
                    first = self.left_operand(i - 2)
                else:
                    edit = Edit(t.start, t.start, "NOT ")
                    first = self.left_operand(i - 1)
                yield self.site("negate_compare", [edit], first, self._matching(i + 1))

    def dropped_nots(self) -> Iterator[Site]:
        for i, t in enumerate(self.sig):
            if t.upper != "NOT" or self.up(i - 1) == "IS" or i + 1 >= len(self.sig):
                continue
            if self.up(i + 1) in ("IN", "NULL", "DISTINCT"):
                continue
            edit = Edit(t.start, self.sig[i + 1].start, "")
            last = self._matching(i + 1) if self.tx(i + 1) == "(" else i + 1
            if self.up(i + 1) == "EXISTS" and self.tx(i + 2) == "(":
                last = self._matching(i + 2)
            yield self.site("drop_not", [edit], i, last)

    def and_or(self) -> Iterator[Site]:
        # Each AND/OR once, judged within the innermost condition holding it
        # (a WHERE inside an EXISTS is its own condition).
        innermost: dict[int, tuple[int, int]] = {}
        for _kind, first, last in self.conditions():
            for j in range(first, last + 1):
                if self.up(j) in ("AND", "OR") and innermost.get(j, (-1, -1))[0] < first:
                    innermost[j] = (first, last)
        for j, (first, last) in sorted(innermost.items()):
            if self._between_and(j, first):
                continue
            swapped = "OR" if self.up(j) == "AND" else "AND"
            if self.sig[j].text.islower():
                swapped = swapped.lower()
            edit = Edit(self.sig[j].start, self.sig[j].end, swapped)
            lo, hi = self._neighbours(j, first, last)
            yield self.site("and_or", [edit], lo, hi)

    def _neighbours(self, j: int, first: int, last: int) -> tuple[int, int]:
        """The terms either side of the AND/OR at ``j`` (within first..last)."""
        d = self.depth[j]
        lo = j - 1
        while lo > first and not (self.depth[lo - 1] == d and self.up(lo - 1) in ("AND", "OR")):
            if self.depth[lo - 1] < d:
                break
            lo -= 1
        hi = j + 1
        while hi < last and not (self.depth[hi + 1] == d and self.up(hi + 1) in ("AND", "OR")):
            if self.depth[hi + 1] < d or (self.depth[hi + 1] == d and self.tx(hi + 1) == ")"):
                break
            hi += 1
        return lo, hi

    def _between_and(self, j: int, first: int) -> bool:
        d = self.depth[j]
        for k in range(j - 1, first - 1, -1):
            if self.depth[k] == d and self.up(k) in ("AND", "OR"):
                return False
            if self.depth[k] == d and self.up(k) == "BETWEEN":
                return True
        return False

    def clock_to_now(self) -> Iterator[Site]:
        for i, t in enumerate(self.sig):
            if t.upper != "CLOCK_TIMESTAMP" or self.tx(i + 1) != "(" or self.tx(i + 2) != ")":
                continue
            before, after = self.tx(i - 1), self.tx(i + 3)
            compared = (before in _COMPARISONS and (i - 1) not in self.assignment_eq) or (
                after in _COMPARISONS
            )
            if compared or before == ":=":
                edit = Edit(t.start, self.sig[i + 2].end, "now()")
                first, last = i, i + 2
                if before in _COMPARISONS:
                    first = self.left_operand(i - 2)
                elif before == ":=":
                    first = self._statement_start(i)
                if after in _COMPARISONS:
                    last = self.right_operand(i + 4)
                yield self.site("clock_to_now", [edit], first, last)

    def _statement_start(self, i: int) -> int:
        j = i
        while j > 0 and (self.up(j - 1) or self.tx(j - 1)) not in _STATEMENT_STARTS:
            j -= 1
        return j

    def locks(self) -> Iterator[Site]:
        for i, t in enumerate(self.sig):
            if t.upper != "FOR":
                continue
            j = i + 1
            if self.up(j) == "NO" and self.up(j + 1) == "KEY":
                j += 2
            elif self.up(j) == "KEY":
                j += 1
            if self.up(j) not in ("UPDATE", "SHARE"):
                continue
            end = j
            if self.up(end + 1) == "OF":
                end += 2
                while self.tx(end + 1) in (",", "."):
                    end += 2
            skip = None
            if self.up(end + 1) == "SKIP" and self.up(end + 2) == "LOCKED":
                skip = end + 1
                end += 2
            elif self.up(end + 1) == "NOWAIT":
                end += 1
            yield self.removal(
                "drop_lock", Edit(self.sig[i - 1].end, self.sig[end].end, ""), i, end
            )
            if skip is not None:
                edit = Edit(self.sig[skip - 1].end, self.sig[skip + 1].end, "")
                yield self.removal("drop_skip_locked", edit, skip, skip + 1)

    def raises(self) -> Iterator[Site]:
        for i, t in enumerate(self.sig):
            if t.upper != "RAISE" or self.up(i + 1) in _RAISE_QUIET_LEVELS:
                continue
            end = i
            while end + 1 < len(self.sig) and self.tx(end + 1) != ";":
                end += 1
            yield self.site("raise_noop", [Edit(t.start, self.sig[end].end, "NULL")], i, end)

    def increments(self) -> Iterator[Site]:
        for i, t in enumerate(self.sig):
            if t.text != "+" or self.tx(i + 1) != "1" or i == 0:
                continue
            if self.tx(i + 2) in ("*", "/", ".", "::", "^", "%"):
                continue
            edit = Edit(self.sig[i - 1].end, self.sig[i + 1].end, "")
            yield self.site("drop_increment", [edit], self.left_operand(i - 1), i + 1)

    def statements(self) -> Iterator[Site]:
        for i, t in enumerate(self.sig):
            if t.upper not in ("INSERT", "UPDATE", "DELETE", "PERFORM"):
                continue
            prev = self.up(i - 1) or self.tx(i - 1)
            if i > 0 and prev not in _STATEMENT_STARTS:
                continue
            end = i
            while end + 1 < len(self.sig) and self.tx(end + 1) != ";":
                end += 1
            yield self.site("drop_statement", [Edit(t.start, self.sig[end].end, "NULL")], i, end)


def _depths(sig: list[Token]) -> list[int]:
    """Open parentheses before each token (a ')' counts its own '(' as open)."""
    out: list[int] = []
    level = 0
    for t in sig:
        if t.text == "(":
            out.append(level)
            level += 1
        elif t.text == ")":
            out.append(level)
            level -= 1
        else:
            out.append(level)
    return out


def _apply_local(text: str, start: int, end: int, edits: list[Edit]) -> str:
    """The snippet ``text[start:end]`` as the edits leave it."""
    lo = min(start, *(e.start for e in edits))
    hi = max(end, *(e.end for e in edits))
    snippet = text[lo:hi]
    for e in sorted(edits, key=lambda e: e.start, reverse=True):
        snippet = snippet[: e.start - lo] + e.replacement + snippet[e.end - lo :]
    return snippet


def sql_sites(text: str, source: str, *, queries: bool) -> list[Site]:
    """Every site of one SQL file (``queries``: a ``sql/queries`` file)."""
    tokens = tokenize(text, source)
    bodies = query_bodies(text) if queries else migration_bodies(text, tokens)
    sites: list[Site] = []
    for body in bodies:
        sites.extend(_BodySites(text, body, tokens).all())
    return sites

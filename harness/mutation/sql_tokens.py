"""A small SQL / PL/pgSQL tokenizer: enough to find mutation sites by position.

It does not parse SQL; it splits text into tokens that keep their exact
offsets, so a mutation is an edit of the original text and everything else
stays byte for byte. Dollar quotes (``$$``, ``$body$``) are tokens of their
own and what lies between them is tokenized as code, because the protocol's
function bodies live there; single-quoted strings, quoted identifiers and
comments are single tokens and are never looked into.

Invariant: the tokens, including whitespace and comments, cover the text
exactly and in order (``"".join(t.text for t in tokens) == text``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["ws", "comment", "string", "ident", "quoted", "number", "dollar", "param", "op"]

_PATTERNS: list[tuple[Kind, re.Pattern[str]]] = [
    ("ws", re.compile(r"\s+")),
    ("comment", re.compile(r"--[^\n]*|/\*.*?\*/", re.S)),
    # E'..' strings do not occur in the protocol's SQL; '' is the escape here.
    ("string", re.compile(r"'(?:[^']|'')*'")),
    ("quoted", re.compile(r'"(?:[^"]|"")*"')),
    ("dollar", re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")),
    # psycopg named placeholders in sql/queries/*.sql
    ("param", re.compile(r"%\([a-z_][a-z0-9_]*\)s")),
    ("number", re.compile(r"\d+(?:\.\d+)?")),
    ("ident", re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")),
    (
        "op",
        re.compile(r"->>|#>>|<>|!=|<=|>=|:=|=>|::|->|\|\||[-+*/%<>=(),;.\[\]:|&#^~!@?$]"),
    ),
]


class SqlTokenError(ValueError):
    """The text holds something the tokenizer does not know (it names where)."""


@dataclass(frozen=True)
class Token:
    kind: Kind
    text: str
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.text)

    @property
    def upper(self) -> str:
        """The keyword form of an identifier ('' for anything else)."""
        return self.text.upper() if self.kind == "ident" else ""

    @property
    def significant(self) -> bool:
        return self.kind not in ("ws", "comment")


def tokenize(text: str, source: str = "<sql>") -> list[Token]:
    """Every token of ``text``, whitespace and comments included, in order."""
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        for kind, pattern in _PATTERNS:
            match = pattern.match(text, pos)
            if match and match.end() > pos:
                tokens.append(Token(kind, match.group(), pos))
                pos = match.end()
                break
        else:
            line = text.count("\n", 0, pos) + 1
            raise SqlTokenError(f"{source}:{line}: cannot tokenize {text[pos : pos + 20]!r}")
    return tokens


def significant(tokens: list[Token]) -> list[Token]:
    """The tokens that are not whitespace or comments."""
    return [t for t in tokens if t.significant]


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1

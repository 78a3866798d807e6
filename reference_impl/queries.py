"""Named SQL statements, kept as SQL in ``sql/queries/*.sql``.

Each statement sits under a ``-- name: <name>`` header followed by one
``-- <description>`` line. Code looks statements up by name, so a statement
can be swapped (``Queries.replace``) without touching the code that runs it:
that is how a mutant breaks exactly one rule.

Invariants: names are unique across all files; every statement has a
description and a non-empty body; lookup of an unknown name raises KeyError
naming what exists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import LiteralString

QUERY_DIR = Path(__file__).parent / "sql" / "queries"
_HEADER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$")


class QueryFileError(ValueError):
    """A query file is malformed (missing description, empty body or duplicate name)."""


@dataclass(frozen=True)
class Statement:
    """One named statement."""

    name: str
    description: str
    sql: LiteralString
    source: str


def parse(text: str, source: str = "<string>") -> list[Statement]:
    """Split one file's text into its named statements."""
    statements: list[Statement] = []
    name: str | None = None
    description = ""
    body: list[str] = []

    def flush() -> None:
        if name is None:
            if any(line.strip() and not line.lstrip().startswith("--") for line in body):
                raise QueryFileError(f"{source}: SQL before the first '-- name:' header")
            return
        sql = "\n".join(body).strip()
        if not description:
            raise QueryFileError(f"{source}: statement {name!r} has no '-- description' line")
        if not sql:
            raise QueryFileError(f"{source}: statement {name!r} has an empty body")
        # The files are part of the package, not user input: literal SQL.
        statements.append(Statement(name, description, sql, source))

    for line in text.splitlines():
        match = _HEADER.match(line.strip())
        if match:
            flush()
            name, description, body = match.group(1), "", []
            continue
        if name is not None and not description and not body and line.startswith("--"):
            description = line.lstrip("-").strip()
            continue
        body.append(line)
    flush()
    return statements


class Queries(Mapping[str, Statement]):
    """All named statements, looked up by name."""

    def __init__(self, statements: Iterable[Statement]) -> None:
        self._by_name: dict[str, Statement] = {}
        for st in statements:
            if st.name in self._by_name:
                other = self._by_name[st.name].source
                raise QueryFileError(f"statement {st.name!r} defined in {other} and {st.source}")
            self._by_name[st.name] = st

    @classmethod
    def load(cls, directory: Path = QUERY_DIR) -> Queries:
        statements: list[Statement] = []
        for path in sorted(directory.glob("*.sql")):
            statements.extend(parse(path.read_text(encoding="utf-8"), path.name))
        return cls(statements)

    def __getitem__(self, name: str) -> Statement:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name))
            raise KeyError(f"no statement named {name!r}; known: {known}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def sql(self, name: str) -> LiteralString:
        return self[name].sql

    def replace(self, name: str, sql: LiteralString, description: str | None = None) -> Queries:
        """A copy with one statement swapped (the statement must exist)."""
        old = self[name]
        new = Statement(name, description or old.description, sql, "replaced")
        return Queries([new if st.name == name else st for st in self._by_name.values()])

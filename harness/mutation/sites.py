"""What a generated mutant is: one named, reproducible edit of one source file.

A generator (:mod:`.sql_sites`, :mod:`.python_sites`) finds *sites*: one
operator applied at one place, as text edits of the original file. A site
becomes an :class:`AutoMutant` once it has its id.

Invariants:
- a mutant's id depends only on its file, the enclosing function (or named
  statement), the operator and the text it changes, plus an occurrence
  number among identical changes in that function; never on a line number.
  So a triage file keyed by id keeps working while unrelated code changes,
  and an id stops matching exactly when the code it named changed;
- applying a mutant changes only the bytes its edits cover;
- no two mutants of a file make the same edits.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Language = Literal["sql", "python"]


@dataclass(frozen=True)
class Edit:
    """Replace ``text[start:end]`` with ``replacement``."""

    start: int
    end: int
    replacement: str


@dataclass(frozen=True)
class Site:
    """One operator at one place, before it has an id."""

    scope: str
    operator: str
    edits: tuple[Edit, ...]
    original: str
    replacement: str


def apply_edits(text: str, edits: Iterable[Edit]) -> str:
    """``text`` with non-overlapping ``edits`` applied (any order given)."""
    out = text
    last_start = len(text) + 1
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        if edit.end > last_start or edit.start > edit.end:
            raise ValueError(f"overlapping or inverted edits at offset {edit.start}")
        out = out[: edit.start] + edit.replacement + out[edit.end :]
        last_start = edit.start
    return out


def squeeze(snippet: str) -> str:
    """A snippet on one line, runs of whitespace as one space."""
    return re.sub(r"\s+", " ", snippet).strip()


@dataclass(frozen=True)
class AutoMutant:
    """One generated mutant of the reference implementation."""

    id: str
    language: Language
    path: str  # relative to the repository root
    line: int
    scope: str
    operator: str
    original: str
    replacement: str
    edits: tuple[Edit, ...]

    def apply(self, text: str) -> str:
        return apply_edits(text, self.edits)

    def describe(self) -> str:
        before = _short(squeeze(self.original))
        after = _short(squeeze(self.replacement)) or "(removed)"
        return f"{self.operator}: `{before}` -> `{after}`"

    def diff(self, text: str) -> str:
        """A unified diff of the file, three lines of context."""
        return "".join(
            difflib.unified_diff(
                text.splitlines(keepends=True),
                self.apply(text).splitlines(keepends=True),
                fromfile=f"a/{self.path}",
                tofile=f"b/{self.path}",
                n=3,
            )
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "language": self.language,
            "path": self.path,
            "line": self.line,
            "scope": self.scope,
            "operator": self.operator,
            "change": self.describe(),
        }


def _short(text: str, limit: int = 70) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def mutants_of_file(
    language: Language, path: str, text: str, sites: Sequence[Site]
) -> list[AutoMutant]:
    """Name the sites of one file (see the module's invariant on ids)."""
    seen: Counter[tuple[str, str, str, str]] = Counter()
    edited: set[tuple[Edit, ...]] = set()
    mutants: list[AutoMutant] = []
    for site in sorted(sites, key=lambda s: (min(e.start for e in s.edits), s.operator)):
        edits = tuple(sorted(site.edits, key=lambda e: e.start))
        if edits in edited:
            continue  # the same change found twice (two operators or regions): one mutant
        edited.add(edits)
        key = (site.scope, site.operator, squeeze(site.original), squeeze(site.replacement))
        occurrence = seen[key]
        seen[key] += 1
        digest = hashlib.sha256("\x1f".join([*key, str(occurrence)]).encode()).hexdigest()[:8]
        start = min(e.start for e in site.edits)
        mutants.append(
            AutoMutant(
                id=f"{path}:{site.scope}:{site.operator}:{digest}",
                language=language,
                path=path,
                line=text.count("\n", 0, start) + 1,
                scope=site.scope,
                operator=site.operator,
                original=site.original,
                replacement=site.replacement,
                edits=site.edits,
            )
        )
    return mutants

"""The triage file of generated mutants (``reference_impl/mutants/equivalent.yaml``).

Two lists, each entry keyed by a generated mutant's id:

- ``equivalent``: mutants no observable behaviour can tell from the correct
  code, each with the ``reason`` why. They leave the score's denominator and
  are not run (``--run-equivalent`` runs them anyway, to re-check a reason).
- ``survivors``: mutants the matrix does not catch today, analysed: which
  invariant they break (``breaks``) and which experiment, existing or
  missing, should catch them (``should_catch``). They still count as
  survived; the analysis is printed with them.

Invariant: every entry has a non-empty id and its reason (or breaks and
should_catch), and no id is in both lists; :func:`load` raises TriageError
saying which entry is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.evidence import bounded_read


class TriageError(ValueError):
    """The triage file is malformed (the message names the entry)."""


@dataclass(frozen=True)
class Survivor:
    breaks: str
    should_catch: str


@dataclass
class Triage:
    equivalent: dict[str, str] = field(default_factory=dict)  # id -> reason
    survivors: dict[str, Survivor] = field(default_factory=dict)
    source: Path | None = None

    def stale(self, ids: Iterable[str]) -> list[str]:
        """Entries whose id no generated mutant has any more (the code changed)."""
        known = set(ids)
        return sorted(i for i in [*self.equivalent, *self.survivors] if i not in known)


def _text(entry: dict[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise TriageError(f"{where}: `{key}` must be a non-empty text")
    return " ".join(value.split())


def load(path: Path) -> Triage:
    """The triage file at ``path`` (an empty triage when it does not exist);
    bounded_read.FileRefused when it is not a regular file, too large or too deep."""
    if not path.exists() and not path.is_symlink():
        return Triage(source=path)
    try:
        raw = bounded_read.load_yaml(path) or {}
    except OSError as exc:
        raise TriageError(f"{path} cannot be read: {exc.strerror or exc}") from None
    except bounded_read.NotParsed as exc:
        raise TriageError(str(exc)) from None
    if not isinstance(raw, dict) or set(raw) - {"equivalent", "survivors"}:
        raise TriageError(f"{path}: expected the keys `equivalent` and `survivors` only")
    triage = Triage(source=path)
    for kind in ("equivalent", "survivors"):
        entries = raw.get(kind) or []
        if not isinstance(entries, list):
            raise TriageError(f"{path}: `{kind}` must be a list")
        for n, entry in enumerate(entries, 1):
            where = f"{path}: {kind} entry {n}"
            if not isinstance(entry, dict):
                raise TriageError(f"{where}: must be a mapping with `id`")
            mutant_id = _text(entry, "id", where)
            if mutant_id in triage.equivalent or mutant_id in triage.survivors:
                raise TriageError(f"{where}: {bounded_read.token(mutant_id)} is listed twice")
            if kind == "equivalent":
                triage.equivalent[mutant_id] = _text(entry, "reason", where)
            else:
                triage.survivors[mutant_id] = Survivor(
                    _text(entry, "breaks", where), _text(entry, "should_catch", where)
                )
    return triage

"""What an experiment needs of the worker beyond the required contract.

An experiment arms injection points, sends optional ops and, where a system
declares what it offers, relies on capabilities. A worker that lacks one of
them cannot be judged there: the experiment ends *unknown* (or *not
applicable*, once the worker said so itself), never pass. This module is
the one list of those needs, written beside each experiment's spec
(``ExperimentSpec.needs``), so that ``fencecheck contract`` can say which
experiments a worker will leave unjudged before any of them runs.

Invariants:
- a :class:`Need` names one thing a worker may lack: an injection point of
  contract section 3, or an optional op of ``operations.json``;
- a need with no variants holds for every variant of its experiment, one
  with variants for those only;
- :func:`consequences` names each experiment run (``T[renew]``) a missing
  thing leaves unjudged, in matrix order, every run once per thing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

NeedKind = Literal["point", "op"]


@dataclass(frozen=True)
class Need:
    """One thing an experiment relies on; ``variants`` empty: all of them."""

    kind: NeedKind
    name: str
    variants: tuple[str, ...] = ()

    def applies_to(self, variant: str | None) -> bool:
        return not self.variants or (variant or "") in self.variants

    def describe(self) -> str:
        what = {"point": "injection point", "op": "optional op"}[self.kind]
        return f"{what} {self.name}"


def point(name: str, *variants: str) -> Need:
    return Need("point", name, tuple(variants))


def op(name: str, *variants: str) -> Need:
    return Need("op", name, tuple(variants))


class NeedsSpec(Protocol):
    """What :func:`consequences` reads of an experiment's spec."""

    @property
    def id(self) -> str: ...

    @property
    def variants(self) -> tuple[str, ...]: ...

    @property
    def needs(self) -> tuple[Need, ...]: ...


def run_label(experiment: str, variant: str | None) -> str:
    """``T[renew]``, or ``B`` for an experiment without variants."""
    return f"{experiment}[{variant}]" if variant else experiment


def consequences(
    specs: Iterable[NeedsSpec], missing: Iterable[tuple[NeedKind, str]]
) -> dict[tuple[NeedKind, str], list[str]]:
    """For each missing (kind, name): the experiment runs that need it."""
    wanted = set(missing)
    out: dict[tuple[NeedKind, str], list[str]] = {key: [] for key in sorted(wanted)}
    for spec in specs:
        for variant in spec.variants or (None,):
            for need in spec.needs:
                key = (need.kind, need.name)
                label = run_label(spec.id, variant)
                if key in wanted and need.applies_to(variant) and label not in out[key]:
                    out[key].append(label)
    return out


def needed(specs: Iterable[NeedsSpec], kind: NeedKind) -> set[str]:
    """Every name of ``kind`` some experiment of ``specs`` needs."""
    return {n.name for s in specs for n in s.needs if n.kind == kind}


def format_runs(labels: list[str], limit: int = 8) -> str:
    """``T[renew], T[claim]`` (a long list cut, with how many more)."""
    shown = labels[:limit]
    more = f" and {len(labels) - limit} more" if len(labels) > limit else ""
    return ", ".join(shown) + more if shown else "no experiment"


def by_variant(specs: Mapping[str, NeedsSpec]) -> dict[str, list[Need]]:
    """Each experiment run's needs, by its label (tests and `fencecheck list`)."""
    out: dict[str, list[Need]] = {}
    for spec in specs.values():
        for variant in spec.variants or (None,):
            out[run_label(spec.id, variant)] = [n for n in spec.needs if n.applies_to(variant)]
    return out

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
  contract section 3, an optional op of ``operations.json``, or an optional
  capability of the mapping (``harness.contract.mapping.CAPABILITIES``; the
  fencing token is none: its absence is no excuse);
- a system that declares it lacks a capability or a point an experiment
  needs makes that experiment *not applicable* (:func:`declined`), never
  fail, never unknown; one that lacks it without saying so leaves it
  *unknown*;
- a need with no variants holds for every variant of its experiment, one
  with variants for those only;
- :func:`consequences` names each experiment run (``T[renew]``) a missing
  thing leaves unjudged, in matrix order, every run once per thing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from harness.contract.mapping import CAPABILITIES, Declaration

NeedKind = Literal["point", "op", "capability"]


@dataclass(frozen=True)
class Need:
    """One thing an experiment relies on; ``variants`` empty: all of them."""

    kind: NeedKind
    name: str
    variants: tuple[str, ...] = ()

    def applies_to(self, variant: str | None) -> bool:
        return not self.variants or (variant or "") in self.variants

    def describe(self) -> str:
        what = {"point": "injection point", "op": "optional op", "capability": "capability"}
        return f"{what[self.kind]} {self.name}"


def point(name: str, *variants: str) -> Need:
    return Need("point", name, tuple(variants))


def op(name: str, *variants: str) -> Need:
    return Need("op", name, tuple(variants))


def capability(name: str, *variants: str) -> Need:
    if name not in CAPABILITIES:
        raise ValueError(f"{name!r} is not a capability of the mapping: {sorted(CAPABILITIES)}")
    return Need("capability", name, tuple(variants))


def capabilities(*names: str) -> tuple[Need, ...]:
    """Several capabilities every variant needs."""
    return tuple(capability(n) for n in names)


class NeedsSpec(Protocol):
    """What :func:`consequences` reads of an experiment's spec."""

    @property
    def id(self) -> str: ...

    @property
    def variants(self) -> tuple[str, ...]: ...

    @property
    def needs(self) -> tuple[Need, ...]: ...


def declined(needs_of_run: Iterable[Need], declaration: Declaration) -> str | None:
    """Why a system that declared ``declaration`` makes a run with these needs
    not applicable (the capabilities and points it says it lacks), or None."""
    caps = declaration.capabilities
    lacking = [n.name for n in needs_of_run if n.kind == "capability" and not caps.offers(n.name)]
    lacking += [
        f"injection point {n.name}"
        for n in needs_of_run
        if n.kind == "point" and not caps.hosts(n.name)
    ]
    if not lacking:
        return None
    return f"not applicable: the system declares no {', '.join(dict.fromkeys(lacking))}"


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


def format_runs(labels: list[str], limit: int = 12) -> str:
    """``T[renew], T[claim]``; three runs or more of one experiment said once
    (``E (6 runs)``), a long list cut with how many more."""
    by_experiment: dict[str, list[str]] = {}
    for label in labels:
        by_experiment.setdefault(label.split("[", 1)[0], []).append(label)
    words = [
        f"{experiment} ({len(group)} runs)" if len(group) > 2 else ", ".join(group)
        for experiment, group in by_experiment.items()
    ]
    shown = words[:limit]
    more = f" and {len(words) - limit} more" if len(words) > limit else ""
    return ", ".join(shown) + more if shown else "no experiment"


def by_variant(specs: Mapping[str, NeedsSpec]) -> dict[str, list[Need]]:
    """Each experiment run's needs, by its label (tests and `fencecheck list`)."""
    out: dict[str, list[Need]] = {}
    for spec in specs.values():
        for variant in spec.variants or (None,):
            out[run_label(spec.id, variant)] = [n for n in spec.needs if n.applies_to(variant)]
    return out

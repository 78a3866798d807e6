"""The registry of global invariants and the one entry point, :func:`check`.

An invariant is one small function ``(Evidence) -> Finding`` registered with
:func:`invariant` under a dotted name, the SPEC rule it belongs to and the
sentence it promises. To add one: write the function in the module of its
area (``leases``, ``writes``, ``effects``, ``runs``, ``outbox``,
``operators``, ``accounts``, ``paths``), decorate it, and give it a unit test with a
violating and a clean hand-built history (tests/harness/test_invariants.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from harness.checking.invariants.model import Evidence, Finding, Result

# How many violating rows a result keeps (the count is always exact).
MAX_ROWS = 20


@dataclass(frozen=True)
class Invariant:
    name: str
    rule: str
    expected: str
    judge: Callable[[Evidence], Finding]


INVARIANTS: dict[str, Invariant] = {}


def invariant(
    name: str, rule: str, expected: str
) -> Callable[[Callable[[Evidence], Finding]], Callable[[Evidence], Finding]]:
    """Register ``judge`` as the invariant ``name`` (unique)."""

    def register(judge: Callable[[Evidence], Finding]) -> Callable[[Evidence], Finding]:
        if name in INVARIANTS:
            raise ValueError(f"two invariants named {name!r}")
        INVARIANTS[name] = Invariant(name, rule, expected, judge)
        return judge

    return register


def check(evidence: Evidence, exemptions: Mapping[str, str] | None = None) -> list[Result]:
    """Judge every registered invariant on ``evidence``.

    ``exemptions`` maps an invariant name to the reason an experiment
    produces, by design, a state that invariant forbids: such a result is
    still computed and reported, with the reason, but does not fail. An
    exemption naming no registered invariant is an error (a typo must not
    silently exempt nothing).
    """
    exemptions = dict(exemptions or {})
    unknown = sorted(set(exemptions) - set(INVARIANTS))
    if unknown:
        raise KeyError(f"exemption for unknown invariant(s) {unknown}; known: {sorted(INVARIANTS)}")
    results = []
    for inv in INVARIANTS.values():
        found = inv.judge(evidence)
        ok = not found.violations
        if ok:
            observed = found.note or f"{found.checked} item(s) judged, none breaks it"
            if found.checked == 0 and not found.note:
                observed = "nothing of this kind in the history (vacuously true)"
        else:
            observed = f"{len(found.violations)} violation(s) among {found.checked} item(s)"
            if found.note:
                observed += f"; {found.note}"
        results.append(
            Result(
                name=inv.name,
                rule=inv.rule,
                expected=inv.expected,
                ok=ok,
                checked=found.checked,
                violations=found.violations[:MAX_ROWS],
                observed=observed,
                exempt=exemptions.get(inv.name) if not ok else None,
            )
        )
    return results

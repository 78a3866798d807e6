"""Global invariants: judge any finished history from independent evidence only.

Usage, on an experiment's or any stored history::

    from harness.checking.invariants import Evidence, check
    results = check(evidence, exemptions={"name": "why this experiment breaks it"})

Each invariant is one small named function tied to its SPEC rule
(:data:`INVARIANTS`), reporting the exact rows that break it. The runner
gathers :class:`Evidence` once per experiment (:mod:`.gather`) and judges it
after the scenario (:mod:`.experiment`); a broken, non-exempt invariant makes
the experiment *fail*.
"""

from __future__ import annotations

# Importing the area modules registers their invariants, in this order.
from harness.checking.invariants import (
    accounts,
    effects,
    leases,
    operators,
    outbox,
    pacing,
    paths,
    runs,
    writes,
)
from harness.checking.invariants.model import Change, Evidence, Finding, Result
from harness.checking.invariants.registry import INVARIANTS, Invariant, check, invariant

__all__ = [
    "INVARIANTS",
    "Change",
    "Evidence",
    "Finding",
    "Invariant",
    "Result",
    "accounts",
    "check",
    "effects",
    "invariant",
    "leases",
    "operators",
    "outbox",
    "pacing",
    "paths",
    "runs",
    "writes",
]

"""Named mutants of the reference implementation (docs/protocol.md; README, "Trusting the harness: mutants").

Each mutant breaks exactly ONE protocol rule of docs/protocol.md in exactly one place
(see :mod:`reference_impl.mutants.base`) and names the experiment(s) of the
acceptance matrix expected to catch it. ``load_protocol(FENCECHECK_MUTANT)``
looks names up in :data:`REGISTRY`; the correct code never imports this
package. ``python -m reference_impl.worker mutants`` prints the registry as
JSON for the harness, which never imports reference_impl.

Grouped by area: :mod:`.leases` (rule 1), :mod:`.writes` (2, 3, 9, 11),
:mod:`.effects` (4, 5, 6), :mod:`.isolation` (7, 12), :mod:`.execution`
(8, 10, 13).
"""

from __future__ import annotations

from reference_impl.mutants import effects, execution, isolation, leases, writes
from reference_impl.mutants.base import (
    Alteration,
    Component,
    Method,
    Mutant,
    SqlOverlay,
    Statement,
)


def _registry(*groups: tuple[Mutant, ...]) -> dict[str, Mutant]:
    """All mutants by name, in rule order (names unique)."""
    registry: dict[str, Mutant] = {}
    for m in sorted((m for g in groups for m in g), key=lambda m: (m.rule, m.name)):
        if m.name in registry:
            raise ValueError(f"two mutants named {m.name!r}")
        registry[m.name] = m
    return registry


REGISTRY: dict[str, Mutant] = _registry(
    leases.MUTANTS, writes.MUTANTS, effects.MUTANTS, isolation.MUTANTS, execution.MUTANTS
)

__all__ = [
    "REGISTRY",
    "Alteration",
    "Component",
    "Method",
    "Mutant",
    "SqlOverlay",
    "Statement",
]

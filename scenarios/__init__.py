"""The acceptance matrix: one module per experiment, named ``<id>_<slug>.py``.

Each module defines ``SPEC`` (an :class:`harness.engine.experiment.ExperimentSpec`)
and ``run(ctx)``. Reading one module tells the whole story of its experiment:
what it starts, what it injects, what it checks.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

_MODULE = re.compile(r"^([a-z])_[a-z0-9_]+$")


class UnknownExperiment(ValueError):
    """No experiment has that id."""


def all_modules() -> list[ModuleType]:
    """Every experiment module, in matrix order (by id letter)."""
    names = sorted(
        m.name for m in pkgutil.iter_modules(__path__) if _MODULE.match(m.name) is not None
    )
    return [importlib.import_module(f"{__name__}.{n}") for n in names]


_VARIANT = re.compile(r"^([A-Za-z])(?:\[([a-z0-9_]+)\]|-([a-z0-9_]+))?$")


def _parse(raw: str, by_id: dict[str, ModuleType]) -> tuple[ModuleType, str | None]:
    """``V``, ``V[purge]`` or ``V-purge``: the module and the variant named."""
    m = _VARIANT.match(raw.strip())
    key = m.group(1).upper() if m else raw.strip().upper()
    if m is None or key not in by_id:
        raise UnknownExperiment(
            f"unknown experiment {raw!r}; known: {', '.join(sorted(by_id))} "
            "(see `fencecheck list`; one variant: V[purge])"
        )
    module, variant = by_id[key], m.group(2) or m.group(3)
    if variant is not None and variant not in module.SPEC.variants:
        known = ", ".join(module.SPEC.variants) or "none"
        raise UnknownExperiment(
            f"experiment {key} has no variant {variant!r}; its variants: {known}"
        )
    return module, variant


def select(ids: list[str]) -> list[ModuleType]:
    """The modules for ``ids`` (case-insensitive, ``V[purge]`` names a variant),
    all when ``ids`` is empty."""
    modules = all_modules()
    if not ids:
        return modules
    by_id = {m.SPEC.id.upper(): m for m in modules}
    wanted: list[ModuleType] = []
    for raw in ids:
        module, _ = _parse(raw, by_id)
        if module not in wanted:
            wanted.append(module)
    return wanted


def variants(ids: list[str]) -> dict[str, set[str]]:
    """Experiment id -> the variants ``ids`` name of it; an id named whole
    (``V``) or absent is not in the result (all its variants run)."""
    by_id = {m.SPEC.id.upper(): m for m in all_modules()}
    named: dict[str, set[str] | None] = {}
    for raw in ids:
        module, variant = _parse(raw, by_id)
        key = module.SPEC.id
        if variant is None:
            named[key] = None
        elif key not in named or named[key] is not None:
            named[key] = (named.get(key) or set()) | {variant}
    return {k: v for k, v in named.items() if v is not None}

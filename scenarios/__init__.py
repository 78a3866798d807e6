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


def select(ids: list[str]) -> list[ModuleType]:
    """The modules for ``ids`` (case-insensitive), all when ``ids`` is empty."""
    modules = all_modules()
    if not ids:
        return modules
    by_id = {m.SPEC.id.upper(): m for m in modules}
    wanted: list[ModuleType] = []
    for raw in ids:
        key = raw.strip().upper()
        if key not in by_id:
            raise UnknownExperiment(
                f"unknown experiment {raw!r}; known: {', '.join(sorted(by_id))} "
                "(see `fencecheck list`)"
            )
        if by_id[key] not in wanted:
            wanted.append(by_id[key])
    return wanted

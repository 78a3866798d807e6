"""A mutated copy of the reference implementation, and the command that runs it.

Each generated mutant runs from its own copy of ``reference_impl/`` with its
one edit applied, started by a small launcher script next to the copy. A
script's own directory comes first on ``sys.path``, so ``import
reference_impl`` finds the copy (also its ``sql/`` files, which ``migrate``
and the named statements read relative to the package), while ``harness``
(the injection client) still comes from the installed repository.

Invariant: :meth:`MutantWorkspace.preflight` proves, in a process started
exactly like a worker, that the package imported is the mutated copy, that
its modules import and that it builds its protocol (the named statements
load); a mutant never silently runs the original code.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from harness.mutation.catalog import PACKAGE
from harness.mutation.sites import AutoMutant

LAUNCHER = "fencecheck_worker.py"
# Every module a worker imports in its modes (migrate, run, ops).
_PREFLIGHT_MODULES = (
    "reference_impl.worker",
    "reference_impl.runtime",
    "reference_impl.runner",
    "reference_impl.ops",
    "reference_impl.workflow",
)


class PreflightFailed(RuntimeError):
    """The mutated copy does not import, or is not what a worker would import."""


def slug(mutant_id: str) -> str:
    """A directory name for a mutant: readable, unique (hash of the id)."""
    path, scope, operator, digest = mutant_id.rsplit(":", 3)
    stem = Path(path).stem
    return f"{stem}-{scope}-{operator}-{digest}".replace("/", "_").replace(" ", "_")


class MutantWorkspace:
    """``<parent>/<slug>/reference_impl`` (mutated) and ``<parent>/<slug>/fencecheck_worker.py``."""

    def __init__(self, mutant: AutoMutant, repo_root: Path, parent: Path) -> None:
        self.mutant = mutant
        self.root = parent / slug(mutant.id)
        if self.root.exists():
            shutil.rmtree(self.root)
        shutil.copytree(
            repo_root / PACKAGE,
            self.root / PACKAGE,
            # The Go worker (its 17 MB binary) is no part of a Python worker.
            # Bytecode is copied with its sources' times (copy2): every process
            # of the mutant reads it instead of compiling the package again
            # (PYTHONDONTWRITEBYTECODE keeps it from writing its own).
            ignore=shutil.ignore_patterns("go"),
        )
        target = self.root / mutant.path
        original = (repo_root / mutant.path).read_text(encoding="utf-8")
        mutated = mutant.apply(original)
        target.write_text(mutated, encoding="utf-8")
        # The mutated module's bytecode is of the original: never let it be read
        # (its recorded source time and size would not match anyway).
        for stale in target.parent.glob(f"__pycache__/{target.stem}.*.pyc"):
            stale.unlink()
        digest = hashlib.sha256(mutated.encode()).hexdigest()
        self.launcher = self.root / LAUNCHER
        self.launcher.write_text(
            f'"""Worker command of generated mutant {mutant.id}\n'
            f'({mutant.path} sha256 {digest})."""\n\n'
            "import runpy\nimport sys\n\n"
            f"sys.path.insert(0, {str(self.root)!r})\n"
            'runpy.run_module("reference_impl.worker", run_name="__main__", alter_sys=True)\n',
            encoding="utf-8",
        )

    @property
    def worker_cmd(self) -> tuple[str, ...]:
        return (sys.executable, str(self.launcher))

    def preflight(self, timeout_s: float = 60.0) -> None:
        """Import the worker's modules the way a worker would; raise PreflightFailed."""
        # A script next to the launcher: the same sys.path a worker gets.
        script = self.root / "fencecheck_preflight.py"
        script.write_text(
            "import importlib\nimport sys\n\n"
            f"sys.path.insert(0, {str(self.root)!r})\n"
            f"mods = [importlib.import_module(m) for m in {_PREFLIGHT_MODULES!r}]\n"
            # What every worker mode does first: build the protocol (loads the statements).
            "importlib.import_module('reference_impl.protocol').load_protocol(None)\n"
            "print(mods[0].__file__)\n",
            encoding="utf-8",
        )
        try:
            proc = subprocess.run(
                [sys.executable, str(script)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PreflightFailed(f"importing the mutated worker took over {timeout_s}s") from exc
        if proc.returncode != 0:
            raise PreflightFailed(
                "the mutated worker does not import: " + proc.stderr.strip()[-1500:]
            )
        imported = Path(proc.stdout.strip()).resolve()
        if not imported.is_relative_to(self.root.resolve()):
            raise PreflightFailed(
                f"a worker would import {imported}, not the mutated copy under {self.root}"
            )

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

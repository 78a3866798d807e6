"""Which experiments to run first against a generated mutant.

A mutant run stops at its first *fail*, so the order is the cost: a caught
mutant costs the experiments run before its catcher, a survivor the whole
matrix whatever the order. Experiments (job labels such as ``E-idempotent``)
are ranked for a mutant by, highest first:

1. how many earlier mutants of the same function (file and scope) it caught;
2. how many earlier mutants of the same file it caught;
3. whether a named mutant that alters the same function lists its experiment
   as a catcher (exact function 2, same last name 1: ``fencecheck.renew`` and
   ``Leases.renew``);
4. how many mutants it caught at all;
5. how many named mutants list its experiment as a catcher (a prior for
   the first mutants of a run);
6. then the shorter experiment first (durations of the baseline run, or of
   earlier runs).

What was learned is kept in a JSON file between runs (``--report-dir``'s
``automutants-learned.json``), so a second run starts where the first ended.

Invariant: :meth:`CatcherOrder.order` returns a permutation of the jobs it is
given (never drops or adds one).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.engine.runner import Job
from harness.evidence.summary import ExperimentResult
from harness.mutation.sites import AutoMutant

_OVERRIDE = re.compile(r"\((?:overrides )?([\w.]+)\)")
_STATEMENT = re.compile(r"statement '(\w+)'")
_METHOD = re.compile(r"^(Protocol\.\w+) replaced")
_DEFAULT_DURATION_S = 5.0


def result_label(r: ExperimentResult) -> str:
    """The job label of a result (``E-idempotent``), as :attr:`Job.label` spells it."""
    return r.experiment_id + (f"-{r.variant}" if r.variant else "")


def named_targets(alters: str) -> list[str]:
    """The function(s) a named mutant's ``alters`` text names, as generated scopes."""
    targets = _OVERRIDE.findall(alters) + [f"query.{n}" for n in _STATEMENT.findall(alters)]
    targets += _METHOD.findall(alters)
    return targets


class CatcherOrder:
    """Ranks experiments for mutants; learns from every result it is shown."""

    def __init__(self, hints: Iterable[tuple[str, Sequence[str]]] = ()) -> None:
        # hints: (alters text of a named mutant, its catcher experiment ids)
        named = [(alters, tuple(catchers)) for alters, catchers in hints]
        self.hints: list[tuple[str, tuple[str, ...]]] = [
            (target, catchers) for alters, catchers in named for target in named_targets(alters)
        ]
        self.prior: Counter[str] = Counter(e for _a, catchers in named for e in set(catchers))
        self.by_scope: dict[str, Counter[str]] = {}
        self.by_file: dict[str, Counter[str]] = {}
        self.overall: Counter[str] = Counter()
        self.durations: dict[str, float] = {}

    # ------------------------------------------------------------ ranking
    def hint(self, mutant: AutoMutant, label: str) -> int:
        experiment = label.split("-", 1)[0]
        last = mutant.scope.rsplit(".", 1)[-1]
        best = 0
        for target, catchers in self.hints:
            if experiment not in catchers:
                continue
            if target == mutant.scope:
                best = max(best, 2)
            elif target.rsplit(".", 1)[-1] == last:
                best = max(best, 1)
        return best

    def _key(self, mutant: AutoMutant, job: Job) -> tuple[float, ...]:
        label = job.label
        scope = self.by_scope.get(f"{mutant.path}:{mutant.scope}", Counter())
        file = self.by_file.get(mutant.path, Counter())
        return (
            -scope[label],
            -file[label],
            -self.hint(mutant, label),
            -self.overall[label],
            -self.prior[label.split("-", 1)[0]],
            self.durations.get(label, _DEFAULT_DURATION_S),
        )

    def order(self, mutant: AutoMutant, jobs: Sequence[Job]) -> list[Job]:
        """``jobs`` most likely catcher first (a stable sort: ties keep matrix order)."""
        return sorted(jobs, key=lambda j: self._key(mutant, j))

    def suggest(self, mutant: AutoMutant, jobs: Sequence[Job], n: int = 3) -> list[str]:
        """The labels most likely to catch ``mutant``: where to look for a survivor."""
        return [j.label for j in self.order(mutant, jobs)[:n]]

    # ------------------------------------------------------------ learning
    def learn(self, mutant: AutoMutant, results: Sequence[ExperimentResult]) -> None:
        for r in results:
            label = result_label(r)
            self.durations[label] = round(r.duration_s, 2)
            if r.verdict.value == "fail":
                self.by_scope.setdefault(f"{mutant.path}:{mutant.scope}", Counter())[label] += 1
                self.by_file.setdefault(mutant.path, Counter())[label] += 1
                self.overall[label] += 1

    def learn_durations(self, results: Sequence[ExperimentResult]) -> None:
        for r in results:
            self.durations[result_label(r)] = round(r.duration_s, 2)

    def save(self, path: Path) -> None:
        data = {
            "by_scope": {k: dict(v) for k, v in sorted(self.by_scope.items())},
            "by_file": {k: dict(v) for k, v in sorted(self.by_file.items())},
            "overall": dict(self.overall),
            "durations": self.durations,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)

    def load(self, path: Path) -> None:
        """Add what an earlier run learned (a missing or unreadable file is ignored)."""
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        for key, counts in data.get("by_scope", {}).items():
            self.by_scope.setdefault(key, Counter()).update(counts)
        for key, counts in data.get("by_file", {}).items():
            self.by_file.setdefault(key, Counter()).update(counts)
        self.overall.update(data.get("overall", {}))
        self.durations.update(data.get("durations", {}))

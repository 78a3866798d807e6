"""Which experiments can reach a generated mutant: the baseline's own count.

A generated SQL mutant changes the body of one database function and nothing
else, so an experiment whose workers never ran that function behaves the same
with the mutant as without it: running it proves nothing about the mutant and
costs its whole wall time. The baseline run of ``mutants --auto`` (the whole
matrix, unmutated) records per experiment which functions its database ran,
from the server's own count (``track_functions``, ``pg_stat_user_functions``,
read once every session but the harness's has ended); a SQL mutant of a
function then runs only the experiments that ran it. Conservative wherever the
count is not the whole story: an experiment without a count (a replicated one
that may have failed over) always runs, and a mutant whose scope is not a
function of the template (top-level DDL: a grant, a policy, a constraint) or a
Python mutant runs them all. A mutant of a function no experiment runs is a
survivor at once: no experiment of the matrix can catch it until one reaches
it (issue 24's subject), and its reason says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from harness.engine.runner import Job
from harness.evidence.summary import ExperimentResult
from harness.mutation.ordering import result_label
from harness.mutation.sites import AutoMutant

FUNCTIONS_SQL = (
    "SELECT n.nspname || '.' || p.proname AS f FROM pg_proc p "
    "JOIN pg_namespace n ON n.oid = p.pronamespace "
    "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') "
    "AND n.nspname NOT LIKE 'pg_toast%'"
)


@dataclass(frozen=True)
class Reach:
    """Per experiment label, the functions it ran (None: not known), and every
    function of the template the counts refer to."""

    ran: Mapping[str, frozenset[str] | None]
    functions: frozenset[str]

    @classmethod
    def of(cls, baseline: Iterable[ExperimentResult], functions: Iterable[str]) -> Reach:
        ran = {
            result_label(r): (
                frozenset(f for f, n in r.functions_called.items() if n > 0)
                if r.functions_called is not None
                else None
            )
            for r in baseline
        }
        return cls(ran, frozenset(functions))

    def jobs_for(self, mutant: AutoMutant, ordered: Sequence[Job]) -> list[Job]:
        """``ordered`` without the experiments that cannot reach ``mutant``'s code."""
        if mutant.language != "sql" or mutant.scope not in self.functions:
            return list(ordered)
        return [
            j
            for j in ordered
            if j.label not in self.ran or (ran := self.ran[j.label]) is None or mutant.scope in ran
        ]

    def unreached_reason(self, mutant: AutoMutant) -> str:
        return (
            f"no experiment of the matrix runs {mutant.scope} (the database's own function "
            "counts of the baseline run): nothing can catch this mutant until one reaches it"
        )

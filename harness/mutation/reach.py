"""Which experiments can reach a generated mutant: what the baseline ran.

A generated mutant changes one function and nothing else, so an experiment
whose processes never ran that function behaves the same with the mutant as
without it: running it proves nothing about the mutant and costs its whole
wall time. The baseline run of ``mutants --auto`` (the whole matrix,
unmutated) records per experiment which functions ran:

- SQL: the database server's own count (``track_functions``,
  ``pg_stat_user_functions``, read once every session but the harness's has
  ended). The server counts a call when it returns, so a call that raised is
  not counted: an experiment whose every call of a function was refused
  (a freeze refused because the operation converged meanwhile, say) would
  look as if it never ran it. So an experiment also counts as reaching every
  function the functions it ran call, by their text (:func:`sql_callees`),
  and every function the server named in the context of an error it logged
  for the experiment's database (:func:`functions_in_error_context`: a
  function called directly whose every call raised);
- Python: the worker command is :mod:`.traced_worker`, which appends each
  function of the reference implementation to the experiment's logs the first
  time it runs, in every process (``migrate`` too).

A mutant of a function then runs only the experiments that ran it.
Conservative wherever the record is not the whole story: an experiment
without one (a replicated experiment's count may sit on a promoted standby;
an interrupted one) always runs; a mutant whose scope is not a function (SQL
top-level DDL: a grant, a policy, a constraint; Python module or class-body
code) runs them all, as does a Python function the template's own
``migrate`` ran (every experiment's database comes from it). A mutant of a
function no experiment ran survives at once: no experiment of the matrix can
catch it until one reaches it, and its reason says so.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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
# The same functions with their source text, for the call graph.
SOURCES_SQL = (
    "SELECT n.nspname || '.' || p.proname AS f, p.prosrc AS src FROM pg_proc p "
    "JOIN pg_namespace n ON n.oid = p.pronamespace "
    "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') "
    "AND n.nspname NOT LIKE 'pg_toast%'"
)


def sql_callees(sources: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """``schema.function`` -> the functions its source calls by their
    qualified name (the implementation's functions run with a fixed
    search_path, so a call names its schema). Over-approximate, never under:
    a name in a comment counts as a call too."""
    calls: dict[str, set[str]] = {}
    for name in sources:
        pattern = re.compile(re.escape(name) + r"\s*\(")
        for caller, src in sources.items():
            if caller != name and pattern.search(src or ""):
                calls.setdefault(caller, set()).add(name)
    return {caller: frozenset(callees) for caller, callees in calls.items()}


def _resolve(names: Iterable[str], functions: frozenset[str]) -> frozenset[str]:
    """``names`` as ``schema.function`` of ``functions``: the server names a
    function in an error's context with its schema only when the session's
    search_path does not reach it (an SQL function never), so a bare name
    stands for every schema's function of that name (over, never under)."""
    resolved: set[str] = set()
    for name in names:
        if "." in name:
            resolved.add(name)
        else:
            resolved.update(f for f in functions if f.rsplit(".", 1)[-1] == name)
    return frozenset(resolved & functions)


def _with_callees(ran: frozenset[str], calls: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """``ran`` and every function reachable from it in the call graph."""
    seen, todo = set(ran), list(ran)
    while todo:
        for callee in calls.get(todo.pop(), ()):
            if callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return frozenset(seen)


def python_functions(repo_root: Path, paths: Iterable[str]) -> frozenset[str]:
    """``<path>:<scope>`` of every function and method defined in ``paths``
    (relative to ``repo_root``), named as mutant scopes are (classes and
    enclosing functions joined by dots)."""
    found: set[str] = set()

    def visit(node: ast.AST, scope: tuple[str, ...], path: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                found.add(f"{path}:{'.'.join((*scope, child.name))}")
                visit(child, (*scope, child.name), path)
            elif isinstance(child, ast.ClassDef):
                visit(child, (*scope, child.name), path)
            else:
                visit(child, scope, path)

    for path in paths:
        visit(ast.parse((repo_root / path).read_text()), (), path)
    return frozenset(found)


@dataclass(frozen=True)
class Reach:
    """Per language and experiment label, the functions it ran (None: not
    known), and the functions the records can speak of: every SQL function of
    the template (``schema.function``) and every Python function of the
    sources (``path:scope``); ``everywhere``, what the template's ``migrate``
    ran."""

    ran: Mapping[str, Mapping[str, frozenset[str] | None]]  # language -> label -> ran
    functions: frozenset[str]
    everywhere: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        baseline: Iterable[ExperimentResult],
        functions: Iterable[str],
        everywhere: Iterable[str] = (),
        sql_calls: Mapping[str, frozenset[str]] | None = None,
    ) -> Reach:
        results = list(baseline)
        sql = {
            result_label(r): (
                _with_callees(
                    frozenset(f for f, n in r.functions_called.items() if n > 0)
                    | _resolve(r.functions_raised or (), frozenset(functions)),
                    sql_calls or {},
                )
                if r.functions_called is not None
                else None
            )
            for r in results
        }
        python = {
            result_label(r): frozenset(r.python_calls) if r.python_calls is not None else None
            for r in results
        }
        return cls({"sql": sql, "python": python}, frozenset(functions), frozenset(everywhere))

    @staticmethod
    def key(mutant: AutoMutant) -> str:
        return mutant.scope if mutant.language == "sql" else f"{mutant.path}:{mutant.scope}"

    def jobs_for(self, mutant: AutoMutant, ordered: Sequence[Job]) -> list[Job]:
        """``ordered`` without the experiments that cannot reach ``mutant``'s code."""
        key = self.key(mutant)
        if key not in self.functions or key in self.everywhere:
            return list(ordered)
        ran = self.ran.get(mutant.language, {})
        return [
            j
            for j in ordered
            if j.label not in ran or (record := ran[j.label]) is None or key in record
        ]

    def unreached_reason(self, mutant: AutoMutant) -> str:
        record = (
            "the database's own function counts"
            if mutant.language == "sql"
            else "the traced worker's record of the functions it ran"
        )
        return (
            f"no experiment of the matrix runs {mutant.scope} ({record} in the baseline run): "
            "nothing can catch this mutant until one reaches it"
        )

"""Every generated mutant of the reference implementation, and choosing some.

What is mutated (read as text; the harness never imports reference_impl):
the protocol's SQL (``reference_impl/sql/migrations/*.sql`` and
``reference_impl/sql/queries/*.sql``) and the reference worker's Python
(``reference_impl/*.py``), except the files in :data:`EXCLUDED`, each with
its reason. The mutants' own package and the tests live elsewhere and are
never mutated.

Invariant: :func:`generate` is deterministic: the same source tree gives the
same mutants with the same ids in the same order, so ``--sample N --seed S``
picks the same mutants every time the code is the same.
"""

from __future__ import annotations

import fnmatch
import hashlib
import random
from collections.abc import Sequence
from pathlib import Path

from harness.mutation.python_sites import python_sites, signatures
from harness.mutation.sites import AutoMutant, Language, mutants_of_file
from harness.mutation.sql_sites import sql_sites
from harness.mutation.superseded import superseded

PACKAGE = "reference_impl"
#: Files of the package that are not mutated, and why.
EXCLUDED: dict[str, str] = {
    "reference_impl/bench.py": "the benchmark, not the worker",
    "reference_impl/bench_go.py": "the Go worker's benchmark driver, not the worker",
    "reference_impl/logs.py": "log formatting only",
    "reference_impl/metrics.py": "Prometheus metric definitions only",
    "reference_impl/__init__.py": "empty",
    "reference_impl/fork_server.py": "how workers are started (worker contract §1, fork-server): "
    "not the protocol; a forked worker is the process an exec'd one would be",
    "reference_impl/sql/migrations/001_roles.sql": (
        "creates the cluster-global roles idempotently: on the harness's cluster they exist "
        "before any mutant's migrate runs, so a change there cannot act "
        "(tests/reference_impl/test_tenancy_roles.py covers the bootstrap)"
    ),
}


class UnknownMutantId(ValueError):
    """An id or pattern given on the command line matches no generated mutant."""


def source_files(repo_root: Path) -> list[tuple[Language, str]]:
    """(language, repo-relative path) of every file that is mutated, in order."""
    package = repo_root / PACKAGE
    files: list[tuple[Language, str]] = []
    for path in sorted(package.glob("*.py")):
        files.append(("python", path.relative_to(repo_root).as_posix()))
    for path in sorted((package / "sql").glob("*/*.sql")):
        files.append(("sql", path.relative_to(repo_root).as_posix()))
    return [(lang, rel) for lang, rel in files if rel not in EXCLUDED]


def source_digest(repo_root: Path) -> str:
    """sha256 over every mutated file (path and text): the code a set of ids names."""
    h = hashlib.sha256()
    for _lang, rel in source_files(repo_root):
        h.update(rel.encode() + b"\0" + (repo_root / rel).read_bytes() + b"\0")
    return h.hexdigest()


def generate(repo_root: Path) -> list[AutoMutant]:
    """Every mutant of the reference implementation under ``repo_root``."""
    files = source_files(repo_root)
    texts = {rel: (repo_root / rel).read_text(encoding="utf-8") for _lang, rel in files}
    sigs = signatures({rel: texts[rel] for lang, rel in files if lang == "python"})
    dead = dead_bodies(repo_root)
    mutants: list[AutoMutant] = []
    for lang, rel in files:
        text = texts[rel]
        if lang == "python":
            sites = python_sites(text, rel, sigs)
        else:
            sites = [
                s
                for s in sql_sites(text, rel, queries="/queries/" in rel)
                if not any(
                    start <= e.start and e.end <= end
                    for e in s.edits
                    for start, end in dead.get(rel, ())
                )
            ]
        mutants.extend(mutants_of_file(lang, rel, text, sites))
    ids = [m.id for m in mutants]
    if len(set(ids)) != len(ids):
        raise AssertionError("two generated mutants share an id")  # a generator bug
    return mutants


def dead_bodies(repo_root: Path) -> dict[str, list[tuple[int, int]]]:
    """Per migration file, the (start, end) offsets of the function bodies a
    later migration replaces before anything runs them (:mod:`.superseded`):
    dead code on every database, never mutated."""
    paths = sorted((repo_root / PACKAGE / "sql" / "migrations").glob("*.sql"))
    migrations = [(p.relative_to(repo_root).as_posix(), p.read_text("utf-8")) for p in paths]
    dead: dict[str, list[tuple[int, int]]] = {}
    for s in superseded(migrations):
        dead.setdefault(s.definition.path, []).append(
            (s.definition.body_start, s.definition.body_end)
        )
    return dead


def select(
    mutants: Sequence[AutoMutant],
    patterns: Sequence[str] = (),
    *,
    language: Language | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> list[AutoMutant]:
    """The mutants named by ``patterns`` (exact ids or shell-style patterns; all
    when empty), of one ``language`` if given, then a seeded ``sample`` of them.

    Raises UnknownMutantId for a pattern that matches nothing."""
    chosen = list(mutants)
    if patterns:
        by_id = {m.id: m for m in mutants}
        picked: dict[str, AutoMutant] = {}
        for pattern in patterns:
            hits = [by_id[pattern]] if pattern in by_id else fnmatch_ids(mutants, pattern)
            if not hits:
                raise UnknownMutantId(
                    f"no generated mutant matches {pattern!r}; "
                    "`fencecheck mutants --auto --list` lists them"
                )
            picked.update((m.id, m) for m in hits)
        chosen = [m for m in mutants if m.id in picked]
    if language is not None:
        chosen = [m for m in chosen if m.language == language]
    if sample is not None:
        # A sample of the whole selection is all of it, still in the seeded
        # order, so that a --budget that runs out leaves a random part unrun.
        chosen = stratified_sample(chosen, min(sample, len(chosen)), seed)
    return chosen


def stratum(m: AutoMutant) -> tuple[str, str]:
    """The stratum a mutant is sampled in: its file and its operator."""
    return (m.path, m.operator)


def stratified_sample(mutants: Sequence[AutoMutant], n: int, seed: int) -> list[AutoMutant]:
    """``n`` of ``mutants``, proportionally from every (file, operator) stratum,
    in a seeded random order.

    Each stratum gets ``n * size / total`` mutants, rounded by the largest
    remainder (ties broken by the seed), drawn at random within it: the sample
    is self-weighting, so its caught fraction estimates the whole set's. The
    order is shuffled so that a run cut short by ``--budget`` leaves a random
    subset unrun, not the last files. Invariant: the same mutants, seed and
    ``n`` give the same list in the same order."""
    rng = random.Random(seed)
    strata: dict[tuple[str, str], list[AutoMutant]] = {}
    for m in mutants:
        strata.setdefault(stratum(m), []).append(m)
    total = len(mutants)
    exact = {key: n * len(members) / total for key, members in strata.items()}
    quota = {key: int(share) for key, share in exact.items()}
    tiebreak = {key: rng.random() for key in strata}
    rest = sorted(strata, key=lambda k: (quota[k] - exact[k], tiebreak[k]))
    for key in rest[: n - sum(quota.values())]:
        quota[key] += 1
    picked = [m for key, members in strata.items() for m in rng.sample(members, quota[key])]
    rng.shuffle(picked)
    return picked


def fnmatch_ids(mutants: Sequence[AutoMutant], pattern: str) -> list[AutoMutant]:
    return [m for m in mutants if fnmatch.fnmatchcase(m.id, pattern)]

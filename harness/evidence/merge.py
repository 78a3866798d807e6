"""Merge the run directories of one sharded run into one run directory.

Each part (``fencecheck run --shard K/N``) is a complete run directory with a
``shard.json`` (:mod:`harness.evidence.shard_record`). Merging:

* refuses parts that are not of one run: a different commit, worker digest,
  mutant, seed, split size, item list, PostgreSQL server version or backend,
  or the same part given twice (:class:`MergeRefused`, naming what differs);
* takes every experiment run of the whole list in list order from the part
  the split gave it to; an item whose part is absent, or whose part has no
  valid archive for it (interrupted, failed to start), is *unknown* with that
  reason: never pass, never silently dropped;
* copies each archive byte for byte (an archive is evidence: it is not
  rewritten; its ``worker_logs_path`` still names where the part wrote its
  logs, which are copied to ``logs/<label>/``), and each part's own
  ``shard.json`` and reports to ``shards/<K>-of-<N>/``;
* builds the results from the archives alone and writes the run-level
  reports through one call (:func:`write_reports`), so the verdict and the
  exit code are those of one run of the whole list;
* seals the merged folder (MANIFEST.sha256) only after its last page: a
  merge that is stopped or fails removes what it wrote, so no folder says
  complete and verifies INTACT without its index and pages.

Parts of ``fencecheck mutants --shard K/N`` merge the same way: one
``mutants.json`` for the whole mutant list, each mutant's archives copied,
and a mutant whose part is absent is *not run*, never caught.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import stopping
from harness.evidence import bounded_read
from harness.evidence.archive import ArchiveInvalid, atomic_write_text, read_archive, validate
from harness.evidence.shard_record import (
    RECORD_NAME,
    RecordInvalid,
    ShardItem,
    ShardRecord,
    read_record,
)
from harness.evidence.summary import (
    ATTEMPTS_DIR,
    ExperimentResult,
    failed_check_lines,
    write_junit,
    write_results_json,
    write_summary,
)
from harness.verdict import Verdict

PART_REPORTS = ("shard.json", "summary.md", "junit.xml", "results.json", "mutants.json")


class MergeRefused(ValueError):
    """The directories cannot be merged into one run; the message says why."""


@dataclass(frozen=True)
class Part:
    path: Path
    record: ShardRecord


@dataclass
class Merged:
    into: Path
    run_id: str
    kind: str
    parts: list[Part]
    missing_parts: list[int]
    # kind "run": one result per experiment run; kind "mutants": one
    # mutants.json entry per mutant.
    results: list[ExperimentResult] = field(default_factory=list)
    mutants: list[dict[str, Any]] = field(default_factory=list)
    passed_over: list[str] = field(default_factory=list)
    header: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    # What to say about the merged run's HTML pages, and the digest of the
    # MANIFEST sealing the merged folder (written last, like a run's).
    pages: str = ""
    digest: str = ""


def find_parts(paths: Sequence[Path]) -> tuple[list[Part], list[str]]:
    """The run directories named by ``paths`` (each path is one, or directly
    holds some, as CI artifact downloads do), and why others were passed over.

    A directory without a readable shard.json is passed over with its reason,
    not refused: a part that died before its services came up leaves just
    that, and its jobs then count as not run (unknown), never as passed.
    """
    parts: list[Part] = []
    passed_over: list[str] = []
    for path in paths:
        if not path.is_dir():
            raise MergeRefused(f"{path} is not a directory")
        found = (
            [path]
            if (path / RECORD_NAME).exists()
            else sorted(d for d in path.iterdir() if d.is_dir() and not d.is_symlink())
        )
        if not found:
            passed_over.append(f"{path}: empty")
        for run_dir in found:
            try:
                parts.append(Part(run_dir, read_record(run_dir)))
            except RecordInvalid as exc:
                passed_over.append(str(exc))
    if not parts:
        raise MergeRefused(
            "no run directory to merge (none holds a readable "
            f"{RECORD_NAME}):\n  "
            + "\n  ".join(passed_over)
            + "\ngive the directories `fencecheck run --shard K/N` wrote"
        )
    return parts, passed_over


def _first_difference(ours: Sequence[Any], theirs: Sequence[Any]) -> str:
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return f", #{index + 1} is {tuple(b)}"
    return ""


def check_one_run(parts: Sequence[Part]) -> None:
    """Refuse parts of different runs, and a part given twice."""
    if not parts:
        raise MergeRefused("nothing to merge: give at least one run directory")
    first = parts[0].record.identity()
    differences: list[str] = []
    for name, value in first.items():
        values = {str(p.path): p.record.identity()[name] for p in parts}
        if any(v != value for v in values.values()):
            if name == "item list and split":
                shown = ", ".join(
                    f"{path}: {len(v)} items{_first_difference(value, v)}"
                    for path, v in values.items()
                )
            else:
                shown = ", ".join(f"{path}: {v}" for path, v in values.items())
            differences.append(f"  {name} differs ({shown})")
    if differences:
        raise MergeRefused(
            "these directories are not parts of one run:\n"
            + "\n".join(differences)
            + "\nrun every part from the same commit, worker, seed and --shard K/N count"
        )
    by_index: dict[int, list[Path]] = {}
    for part in parts:
        by_index.setdefault(part.record.shard_index, []).append(part.path)
    twice = {k: v for k, v in by_index.items() if len(v) > 1}
    if twice:
        raise MergeRefused(
            "the same part given more than once: "
            + "; ".join(
                f"{k}/{parts[0].record.shard_count} in {', '.join(map(str, v))}"
                for k, v in sorted(twice.items())
            )
        )


def _prepare_into(into: Path) -> bool:
    """Make ``into`` ready (new, or an empty directory); True when it was made here."""
    if into.exists() and (not into.is_dir() or any(into.iterdir())):
        raise MergeRefused(f"--into {into} exists and is not empty; name a new directory")
    made = not into.exists()
    into.mkdir(parents=True, exist_ok=True)
    return made


def _remove_written(into: Path, made: bool) -> None:
    """What an unfinished merge wrote into ``into`` (the folder too, if it made it)."""
    from harness.parts.files import remove_tree

    if made:
        remove_tree(into)
        return
    for child in into.iterdir():
        if child.is_dir() and not child.is_symlink():
            remove_tree(child)
        else:
            child.unlink(missing_ok=True)


def _copy_tree(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` (symlinks as links); a FIFO or device in it
    is refused (bounded_read.FileRefused), never read."""
    shutil.copytree(
        source,
        target,
        symlinks=True,
        copy_function=lambda src, dst: bounded_read.copy_file(Path(src), Path(dst)),
    )


def _result_of(
    item: ShardItem,
    verdict: Verdict,
    reason: str,
    archive: dict[str, Any] | None,
    path: Path | None,
) -> ExperimentResult:
    a = archive or {}
    return ExperimentResult(
        experiment_id=str(a.get("experiment_id", item.experiment or item.label)),
        title=str(a.get("title", item.title)),
        variant=a.get("variant", item.variant),
        repeat_index=int(a.get("repeat_index", item.repeat)),
        verdict=verdict,
        reason=reason,
        duration_s=float(a.get("duration_s", 0.0)),
        natural_wait_s=float(a.get("natural_wait_s", item.natural_wait_s)),
        archive_path=path,
        invariant=str(a.get("expected_invariant", item.invariant)),
        failed_checks=failed_check_lines(a.get("checks", [])),
        layer=str(a.get("layer") or ""),
    )


def _take_item(item: ShardItem, part: Part | None, into: Path, count: int) -> ExperimentResult:
    """One item of the whole list: its archive (and logs) copied from its part,
    or *unknown* saying why there is none."""
    where = f"part {item.shard}/{count}"
    if part is None:
        return _result_of(
            item, Verdict.UNKNOWN, f"not run: {where} was not given to merge", None, None
        )
    source = part.path / "archives" / f"{item.label}.yaml"
    if not source.exists():
        return _result_of(
            item,
            Verdict.UNKNOWN,
            f"not run: {where} ({part.path}) has no archive for {item.label} "
            "(interrupted or failed to start; see its logs)",
            None,
            None,
        )
    try:
        archive = read_archive(source)
        validate(archive)
    except (ArchiveInvalid, OSError, ValueError) as exc:
        return _result_of(
            item, Verdict.UNKNOWN, f"{where}'s archive {source} is not valid: {exc}", None, None
        )
    target = into / "archives" / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    bounded_read.copy_file(source, target)
    logs = part.path / "logs" / item.label
    if logs.is_dir():
        _copy_tree(logs, into / "logs" / item.label)
    # The attempts that ended unknown before this one (--retry-unknown).
    earlier = part.path / ATTEMPTS_DIR / item.label
    if earlier.is_dir():
        _copy_tree(earlier, into / ATTEMPTS_DIR / item.label)
    record = part.record
    stated: list[tuple[str, Any, Any]] = [
        ("git_commit", archive.get("git_commit"), record.git_commit)
    ]
    # An archive of an environment that never came up knows no worker or seed.
    worker = archive.get("worker", {})
    if worker.get("command") != "unknown":
        stated.append(("worker digest", worker.get("digest"), record.worker_digest))
    if archive.get("seed") is not None:
        stated.append(("seed", archive.get("seed"), record.seed))
    foreign = [
        f"{name} {got!r} (the run's is {want!r})" for name, got, want in stated if got != want
    ]
    if foreign:
        return _result_of(
            item,
            Verdict.UNKNOWN,
            f"{where}'s archive is not of this run: {'; '.join(foreign)}",
            archive,
            target,
        )
    result = _result_of(
        item,
        Verdict(archive["pass_or_fail"]),
        str(archive.get("verdict_reason", "")),
        archive,
        target,
    )
    if earlier.is_dir():
        result.earlier_attempts = sorted(
            f"{ATTEMPTS_DIR}/{item.label}/{f.name}" for f in earlier.glob("attempt-*.yaml")
        )
    return result


def _take_mutant(
    item: ShardItem, part: Part | None, into: Path, count: int, entries: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """One mutant of the whole list: its entry and archives from its part, or
    an entry saying it was not run (never counted as caught)."""
    where = f"part {item.shard}/{count}"
    entry = entries.get(item.label) if part is not None else None
    if part is None or entry is None:
        why = "was not given to merge" if part is None else f"({part.path}) has no result for it"
        return {
            "mutant": item.label,
            "caught_by": [],
            "expected_caught": False,
            "detail": f"not run: {where} {why}",
            "not_run": True,
        }
    if (part.path / item.label).is_dir():
        _copy_tree(part.path / item.label, into / item.label)
    return {**entry, "not_run": False}


def _mutant_entries(part: Part) -> dict[str, dict[str, Any]]:
    try:
        raw = bounded_read.load_json(part.path / "mutants.json")
    except (OSError, ValueError):
        return {}  # an interrupted part: every mutant of it is "not run"
    return {str(e["mutant"]): e for e in raw if isinstance(e, dict) and "mutant" in e}


def write_reports(
    into: Path, results: Sequence[ExperimentResult], *, header: dict[str, str], wall_s: float
) -> None:
    """Every run-level report of ``into`` from ``results`` (one call; regenerating
    them after a merge is calling it again)."""
    write_summary(into / "summary.md", results, header=header, wall_s=wall_s)
    write_junit(into / "junit.xml", results, suite=f"fencecheck {header.get('run', into.name)}")
    write_results_json(into / "results.json", results)


def merge(paths: Sequence[Path], into: Path) -> Merged:
    """Merge the parts found under ``paths`` into the new run directory ``into``,
    sealed last. A merge that does not finish (a stop, an error) removes what
    it wrote into ``into``; the parts are never touched."""
    parts, passed_over = find_parts(paths)
    check_one_run(parts)
    first = parts[0].record
    if first.kind not in ("run", "mutants"):
        raise MergeRefused(f"{parts[0].path} holds a {first.kind!r} run, which merge cannot take")
    made = _prepare_into(into)
    try:
        return _merge_into(parts, passed_over, into)
    except BaseException:
        _remove_written(into, made)
        raise


def _merge_into(parts: list[Part], passed_over: list[str], into: Path) -> Merged:
    first = parts[0].record
    by_index = {p.record.shard_index: p for p in parts}
    results: list[ExperimentResult] = []
    mutants: list[dict[str, Any]] = []
    if first.kind == "run":
        results = [
            _take_item(item, by_index.get(item.shard), into, first.shard_count)
            for item in first.items
        ]
    else:
        entries = {k: _mutant_entries(p) for k, p in by_index.items()}
        mutants = [
            _take_mutant(
                item, by_index.get(item.shard), into, first.shard_count, entries.get(item.shard, {})
            )
            for item in first.items
        ]
    for part in parts:
        keep = into / "shards" / f"{part.record.shard_index}-of-{first.shard_count}"
        keep.mkdir(parents=True, exist_ok=True)
        for name in PART_REPORTS:
            if (part.path / name).exists():
                bounded_read.copy_file(part.path / name, keep / name)
    missing = sorted(set(range(1, first.shard_count + 1)) - set(by_index))
    walls = [p.record.wall_s for p in parts if p.record.wall_s is not None]
    run_id = "merged-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    unfinished = [
        f"{p.record.shard}" + (f" ({p.record.interrupted})" if p.record.interrupted else "")
        for p in parts
        if p.record.finished_at is None
    ]
    header = {
        "run": run_id,
        "merged from": ", ".join(
            f"{p.record.shard} {p.record.run_id} on {p.record.host}"
            for p in sorted(parts, key=lambda p: p.record.shard_index)
        ),
        "parts missing": ", ".join(f"{k}/{first.shard_count}" for k in missing) or "none",
        "parts unfinished": ", ".join(unfinished) or "none",
        "worker": first.worker_command,
        "worker digest": first.worker_digest,
        "git commit": first.git_commit,
        "mutant": first.mutant or "none",
        "seed": str(first.seed),
        "postgres server": first.postgres_version,
        "backend": first.backend,
        "wall time of the parts": ", ".join(f"{w:.1f} s" for w in walls) or "unknown",
    }
    merged = Merged(
        into=into,
        run_id=run_id,
        kind=first.kind,
        parts=parts,
        missing_parts=missing,
        results=results,
        mutants=mutants,
        passed_over=passed_over,
        header=header,
        wall_s=max(walls, default=0.0),
    )
    if first.kind == "run":
        write_reports(into, results, header=header, wall_s=merged.wall_s)
    else:
        atomic_write_text(into / "mutants.json", json.dumps(mutants, indent=2) + "\n", mode=0o644)
    (into / "merge.json").write_text(
        json.dumps(
            {
                "run_id": run_id,
                "merged_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "parts": [
                    {"shard": str(p.record.shard), "run_id": p.record.run_id, "path": str(p.path)}
                    for p in parts
                ],
                "missing_parts": missing,
                "passed_over": passed_over,
            },
            indent=2,
        )
        + "\n"
    )
    # Sealed like a run, but only after the last page: pages from the merged
    # archives, then the MANIFEST over every file (fencecheck verify checks
    # the merged folder as a whole). A page that cannot be built, or a stop,
    # raises before the seal.
    from harness.evidence.html import write_run_pages
    from harness.evidence.manifest import run_digest, write_manifest

    if first.kind == "run":
        merged.pages = str(write_run_pages(into, sealed=True))
    stopping.check("sealing the merged folder")
    write_manifest(into)
    merged.digest = run_digest(into)
    return merged

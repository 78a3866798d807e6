"""The parts of ``fencecheck mutants --auto --shard K/N`` as one campaign.

The whole generated set takes hours on one machine; split into N parts (the
same split on every machine: the K-th of every N selected mutants, in the
selection's order, so every part gets a share of every file and operator)
it runs as a CI job matrix or a Kubernetes Indexed Job, and ``fencecheck
merge`` joins the parts' folders here:

* it refuses parts that are not of one campaign: another source digest or
  commit (another code), another selection (sample, seed, language, ids),
  another number of parts, or the same part twice (:class:`AutoMergeRefused`);
* every selected mutant's entry comes from the part that owned it; the
  mutants of a missing part are *not run*, never caught;
* each part's mutant folders are copied under ``mutants/`` (the evidence of
  every verdict), its ``run.json``, ``results.json`` and journal under
  ``shards/K-of-N/``; the score, ``results.json``, ``summary.md`` and the
  index are written for the whole set, and the folder is sealed last.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.mutation import auto_report, catalog
from harness.mutation.auto import JOURNAL, RUN_FILE
from harness.mutation.sites import AutoMutant

# What must be equal in every part's run.json for the parts to be one campaign.
SAME = ("source_digest", "commit", "generated", "selected_total", "sample", "seed", "language")


class AutoMergeRefused(ValueError):
    """The folders are not parts of one --auto campaign; the message says why."""


@dataclass
class AutoPart:
    path: Path
    run: dict[str, Any]
    entries: list[dict[str, Any]]

    @property
    def index(self) -> int:
        return int(str(self.run["shard"]).split("/")[0])

    @property
    def count(self) -> int:
        return int(str(self.run["shard"]).split("/")[1])


@dataclass
class AutoMerged:
    into: Path
    parts: list[AutoPart]
    missing: list[int]
    entries: list[dict[str, Any]] = field(default_factory=list)
    score: auto_report.Score | None = None
    published: str = ""


def part(mutants: Sequence[AutoMutant], index: int, count: int) -> list[AutoMutant]:
    """Part ``index`` of ``count`` of ``mutants``: every count-th one from the
    index-th, in the selection's order (the same split on every machine)."""
    return [m for i, m in enumerate(mutants) if i % count == index - 1]


def is_auto_folder(path: Path) -> bool:
    try:
        data = json.loads((path / auto_report.RESULTS).read_text())
    except (OSError, ValueError):
        return (path / RUN_FILE).is_file() and (path / JOURNAL).exists()
    return isinstance(data, dict) and data.get("kind") == "automutants"


def find_auto_parts(paths: Sequence[Path]) -> list[Path]:
    """The --auto folders among ``paths`` and their children (downloaded CI
    artifacts are often one level down)."""
    found: list[Path] = []
    for p in paths:
        if is_auto_folder(p):
            found.append(p)
        elif p.is_dir():
            found += sorted(c for c in p.iterdir() if c.is_dir() and is_auto_folder(c))
    return found


def _read(path: Path) -> AutoPart:
    try:
        run = json.loads((path / RUN_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise AutoMergeRefused(f"{path}: no readable {RUN_FILE} ({exc})") from exc
    if not isinstance(run, dict) or not run.get("shard"):
        raise AutoMergeRefused(
            f"{path} is an --auto folder of no --shard K/N part: there is nothing to merge"
        )
    entries = auto_report.read_journal(path)
    return AutoPart(path, run, entries)


def merge_auto(paths: Sequence[Path], into: Path, repo_root: Path) -> AutoMerged:
    """Merge the --auto parts at ``paths`` into ``into`` (new or empty)."""
    parts = [_read(p) for p in paths]
    if not parts:
        raise AutoMergeRefused("no --auto part folder given")
    first = parts[0]
    for p in parts[1:]:
        for key in SAME:
            if p.run.get(key) != first.run.get(key):
                raise AutoMergeRefused(
                    f"{p.path} and {first.path} are not parts of one campaign: {key} "
                    f"{p.run.get(key)!r} != {first.run.get(key)!r}"
                )
        if p.count != first.count:
            raise AutoMergeRefused(
                f"{p.path} is a part of {p.count}, {first.path} of {first.count}"
            )
    seen: dict[int, Path] = {}
    for p in parts:
        if p.index in seen:
            raise AutoMergeRefused(
                f"part {p.index}/{p.count} given twice: {seen[p.index]}, {p.path}"
            )
        seen[p.index] = p.path
    if catalog.source_digest(repo_root) != first.run.get("source_digest"):
        raise AutoMergeRefused(
            "the parts were generated from other code than this checkout's (source digest "
            f"{first.run.get('source_digest')}): merge with the fencecheck of that commit "
            f"({first.run.get('commit')})"
        )
    if into.exists() and any(into.iterdir()):
        raise AutoMergeRefused(f"--into {into} is not empty")
    into.mkdir(parents=True, exist_ok=True)
    selected_ids: list[str] = list(first.run.get("selected_ids") or [])
    by_id = {m.id: m for m in catalog.generate(repo_root)}
    owned = {e["id"]: e for p in parts for e in p.entries}
    missing = sorted(set(range(1, first.count + 1)) - set(seen))
    entries: list[dict[str, Any]] = []
    for n, mutant_id in enumerate(selected_ids):
        if mutant_id in owned:
            entries.append(owned[mutant_id])
            continue
        owner = n % first.count + 1
        why = (
            f"part {owner}/{first.count} is missing"
            if owner in missing
            else f"part {owner}/{first.count} did not judge it (cut short)"
        )
        m = by_id.get(mutant_id)
        base: dict[str, Any] = m.as_dict() if m is not None else {"id": mutant_id}
        entries.append(
            {
                **base,
                "status": "not_run",
                "caught_by": [],
                "wall_s": 0.0,
                "verdicts": {},
                "detail": why,
                "note": None,
                "should_be_caught_by": [],
                "diff": None,
            }
        )
    for p in sorted(parts, key=lambda p: p.index):
        shard_dir = into / "shards" / f"{p.index}-of-{p.count}"
        shard_dir.mkdir(parents=True)
        for name in (RUN_FILE, JOURNAL, auto_report.RESULTS, auto_report.SUMMARY):
            if (p.path / name).is_file():
                shutil.copy2(p.path / name, shard_dir / name)
        if (p.path / "mutants").is_dir():
            shutil.copytree(p.path / "mutants", into / "mutants", dirs_exist_ok=True)
        if (p.path / "baseline").is_dir():
            shutil.copytree(p.path / "baseline", shard_dir / "baseline")
    run: dict[str, Any] = {
        **{k: first.run.get(k) for k in SAME},
        "command": "fencecheck merge " + " ".join(str(p) for p in paths),
        "selected": len(selected_ids),
        "parts": f"{len(parts)} of {first.count}",
        "missing_parts": missing,
        "wall_s": max((float(p.run.get("wall_s") or 0.0) for p in parts), default=0.0),
        "part_walls_s": {p.run["shard"]: p.run.get("wall_s") for p in parts},
    }
    (into / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n")
    with (into / JOURNAL).open("w", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")
    auto_report.write(into, run, entries)
    merged = AutoMerged(into, parts, missing, entries)
    merged.score = auto_report.score(int(run["generated"] or 0), entries)
    # Pages last, then the seal: each mutant's run pages came with its part.
    merged.published = auto_report.publish(into, pages=False)
    return merged

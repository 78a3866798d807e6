"""A run directory read back from its files alone (archives first).

The pages, ``report`` and ``report --compare`` know a run only through what
it left on disk: ``archives/*.yaml`` (the evidence; an archive's verdict is
its ``pass_or_fail``), ``results.json`` (only for the order the runner ran
the experiments in), ``summary.md``, ``junit.xml`` and ``logs/<label>/``.
Nothing is asked of live state.

Invariant: an archive that cannot be read, or does not match the published
schema, is listed as *unreadable* with its problem and counts as *unknown*;
nothing is built from its content, and it never disappears from a page or a
comparison. A file that is not a regular one, or is over the size or depth
cap, stops the reader (bounded_read.FileRefused: a usage error).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.evidence import bounded_read
from harness.evidence.archive import ArchiveInvalid, load_archive
from harness.verdict import Verdict

ARCHIVES = "archives"
LOGS = "logs"
PAGES = "experiments"
# Run-level facts an index shows and a comparison diffs, by archive path.
FACTS: tuple[tuple[str, str], ...] = (
    ("fencecheck version", "fencecheck_version"),
    ("git commit", "git_commit"),
    ("worker command", "worker.command"),
    ("worker digest", "worker.digest"),
    ("mutant", "worker.mutant"),
    ("PostgreSQL version", "postgres_version"),
    ("PostgreSQL binaries", "deployment.postgres_binaries"),
    ("backend", "deployment.kind"),
    ("python", "runtime_versions.python"),
    ("go", "runtime_versions.go"),
    ("toxiproxy", "runtime_versions.toxiproxy"),
    ("seed", "seed"),
)


class NotARunDirectory(ValueError):
    """The directory holds no archives to build pages from."""


def load_yaml(path: Path) -> dict[str, Any]:
    """One archive, checked against the published schema; ValueError (the
    reason, naming the archive by its place in the run) when it is not one."""
    try:
        return load_archive(path, f"{ARCHIVES}/{path.name}")
    except ArchiveInvalid as exc:
        raise ValueError(f"unreadable: {exc}") from None


def lookup(archive: Mapping[str, Any], dotted: str) -> Any:
    value: Any = archive
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def verdict_of(value: Any) -> Verdict:
    try:
        return Verdict(str(value))
    except ValueError:
        return Verdict.UNKNOWN


@dataclass(frozen=True)
class Entry:
    """What the index and a comparison need of one archive."""

    label: str
    experiment_id: str
    variant: str | None
    repeat_index: int
    title: str
    verdict: Verdict
    reason: str
    invariant: str
    fault: str
    duration_s: float | None
    natural_wait_s: float | None
    started_at: str
    finished_at: str
    facts: dict[str, str] = field(default_factory=dict)
    broken: tuple[str, ...] = ()
    problem: str | None = None
    layer: str = ""

    @property
    def name(self) -> str:
        base = self.experiment_id + (f"[{self.variant}]" if self.variant else "")
        return base + (f"#{self.repeat_index}" if self.repeat_index else "")

    @property
    def group(self) -> str:
        """The experiment and variant, without the repetition."""
        return self.experiment_id + (f"[{self.variant}]" if self.variant else "")


def entry_of(label: str, archive: Mapping[str, Any] | None, problem: str | None = None) -> Entry:
    """The index line of an archive (or of an archive that could not be read)."""
    a: Mapping[str, Any] = archive or {}
    experiment = str(a.get("experiment_id") or label.split("-", 1)[0])
    variant = a.get("variant")
    repeat = a.get("repeat_index")
    checks = [c for c in a.get("checks") or [] if isinstance(c, dict)]
    broken = tuple(
        f"{c.get('kind', '?')} {c.get('name', '?')}: expected {c.get('expected')}, "
        f"observed {c.get('observed')}"
        for c in checks
        if c.get("ok") is False
    )
    facts = {}
    for name, path in FACTS:
        value = lookup(a, path)
        if name == "mutant" and a:
            value = value or "none"  # a run of the correct worker says so
        if value is not None and value != "":
            facts[name] = str(value)
    return Entry(
        label=label,
        experiment_id=experiment,
        variant=None if variant is None else str(variant),
        repeat_index=repeat if isinstance(repeat, int) else _repeat_from_label(label),
        title=str(a.get("title") or ""),
        verdict=verdict_of(a.get("pass_or_fail")) if problem is None else Verdict.UNKNOWN,
        reason=problem or str(a.get("verdict_reason") or ""),
        invariant=str(a.get("expected_invariant") or ""),
        fault=fault_text(a),
        duration_s=_number(a.get("duration_s")),
        natural_wait_s=_number(a.get("natural_wait_s")),
        started_at=str(a.get("started_at") or ""),
        finished_at=str(a.get("finished_at") or ""),
        facts=facts,
        broken=broken,
        problem=problem,
        layer=str(a.get("layer") or ""),
    )


def fault_text(archive: Mapping[str, Any]) -> str:
    """The fault as the experiment states it (``injected_fault``) or, in archives
    without it, what the harness recorded doing."""
    stated = archive.get("injected_fault")
    if stated:
        return str(stated)
    done = observed_faults(archive)
    point = archive.get("fault_injection_point")
    if point:
        done.insert(0, f"injection point {point}")
    return "; ".join(done) or "none recorded"


def observed_faults(archive: Mapping[str, Any]) -> list[str]:
    """The faults the harness recorded: signals, link faults, barrier answers."""
    out: list[str] = []
    for s in archive.get("signals") or []:
        if isinstance(s, dict):
            out.append(f"{s.get('signal')} {str(s.get('process', '?')).removeprefix('worker-')}")
    for f in archive.get("faults") or []:
        if isinstance(f, dict):
            out.append(f"{f.get('kind')} link {f.get('link')}")
    for h in archive.get("control_hits") or []:
        if isinstance(h, dict) and h.get("action") not in (None, "continue"):
            answer = f" → {h['released_with']}" if h.get("released_with") else ""
            out.append(f"{h.get('action')} {h.get('worker')} @{h.get('point')}{answer}")
    return out


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _repeat_from_label(label: str) -> int:
    m = re.search(r"-r(\d+)$", label)
    return int(m.group(1)) if m else 0


def archive_paths(report_dir: Path) -> list[Path]:
    """The run's archives in the order the runner ran them (results.json), then
    any archive it does not list, by name."""
    folder = report_dir / ARCHIVES
    found = sorted(p for p in folder.glob("*.yaml") if not p.name.startswith("."))
    order: list[str] = []
    results = report_dir / "results.json"
    if results.exists():
        try:
            listed = bounded_read.load_json(results)
            order = [Path(str(r["archive"])).name for r in listed if r.get("archive")]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            order = []  # a broken results.json only loses the order
    rank = {name: i for i, name in enumerate(order)}
    return sorted(found, key=lambda p: (rank.get(p.name, len(rank)), p.name))


def require_archives(report_dir: Path) -> list[Path]:
    if not report_dir.is_dir():
        raise NotARunDirectory(f"{report_dir} is not a directory")
    paths = archive_paths(report_dir)
    if not paths:
        raise NotARunDirectory(
            f"{report_dir} has no archives/*.yaml: it is not a run's report directory "
            "(runs write reports/<run-id>/archives/)"
        )
    return paths


def load_entries(report_dir: Path) -> list[Entry]:
    """Every archive of the run as an index line (unreadable ones as unknown)."""
    entries = []
    for path in require_archives(report_dir):
        try:
            entries.append(entry_of(path.stem, load_yaml(path)))
        except ValueError as exc:
            entries.append(entry_of(path.stem, None, problem=str(exc)))
    return entries


def run_facts(entries: list[Entry]) -> dict[str, list[str]]:
    """Each run-level fact with every distinct value the archives record."""
    facts: dict[str, list[str]] = {}
    for name, _ in FACTS:
        values: list[str] = []
        for e in entries:
            value = e.facts.get(name)
            if value is not None and value not in values:
                values.append(value)
        if values:
            facts[name] = values
    return facts


def log_files(report_dir: Path, label: str) -> list[Path]:
    folder = report_dir / LOGS / label
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []

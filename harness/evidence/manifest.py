"""Tamper evidence for a run directory: ``MANIFEST.sha256`` and the evidence digest.

``MANIFEST.sha256`` lists the sha256 of every file in the run directory (one
``<hex>  <path>`` line per file, sorted by path, the format ``sha256sum -c``
reads), so a changed, removed or added file is found by re-hashing.

The *evidence digest* is one value for the whole run: the sha256 over the
manifest lines of the evidence files (archives, logs, results, JUnit, ...),
that is every file except the views that display the digest (``summary.md``,
the HTML pages) and the manifest itself. It is written into ``summary.md`` and
the index page; kept somewhere else (a CI log, a ticket), it lets anyone check
later that the evidence is the one the run produced.

What this proves and what it does not is written in docs/report.md: a
manifest inside the directory catches accidental change and careless edits,
not someone who rewrites the manifest too; only a digest kept outside the
directory does that.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harness.evidence import bounded_read
from harness.evidence.archive import atomic_write_text

MANIFEST_NAME = "MANIFEST.sha256"
SUMMARY_NAME = "summary.md"
# Files that show the digest cannot be part of it; they are derived views
# that `fencecheck report` rebuilds from the evidence.
VIEW_SUFFIXES = (".html",)
VIEW_NAMES = frozenset({SUMMARY_NAME, MANIFEST_NAME})
DIGEST_LINE = "- **evidence digest**: "
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
INDEX_DIGEST_RE = re.compile(r'data-evidence-digest="(sha256:[0-9a-f]{64})"')
READABLE = 0o644  # views and the manifest, like the summary and JUnit files


class ManifestError(ValueError):
    """The directory cannot be sealed or verified (not a directory, odd file names)."""


def file_sha256(path: Path) -> str:
    """sha256 of a regular file; bounded_read.FileRefused for a FIFO, a device, ..."""
    return bounded_read.sha256_hex(path)


def _relative_files(root: Path) -> Iterable[str]:
    """Every regular file and symlink under ``root`` as a '/'-separated relative path."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        # A symlinked directory is not walked into; it is listed like a file
        # so that verify reports it instead of skipping it.
        entries = [*files, *(d for d in dirs if (here / d).is_symlink())]
        for name in entries:
            rel = (here / name).relative_to(root).as_posix()
            if "\n" in rel or "\\" in rel:
                raise ManifestError(f"file name {rel!r} cannot be listed in {MANIFEST_NAME}")
            yield rel


def hash_tree(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` except the manifest itself, by relative path.

    A symlink is hashed as the text of its target, never followed: a link
    out of the directory must not pull outside content into the seal.
    """
    hashes: dict[str, str] = {}
    for rel in _relative_files(root):
        if rel == MANIFEST_NAME:
            continue
        path = root / rel
        if path.is_symlink():
            hashes[rel] = hashlib.sha256(b"symlink:" + os.readlink(path).encode()).hexdigest()
        else:
            hashes[rel] = file_sha256(path)
    return dict(sorted(hashes.items()))


def is_view(rel: str) -> bool:
    """A derived view (summary, pages, manifest): outside the evidence digest."""
    return rel in VIEW_NAMES or rel.endswith(VIEW_SUFFIXES)


def manifest_lines(hashes: dict[str, str]) -> list[str]:
    return [f"{digest}  {rel}\n" for rel, digest in sorted(hashes.items())]


def evidence_digest(hashes: dict[str, str]) -> str:
    """The run-level digest: sha256 over the manifest lines of the evidence files."""
    h = hashlib.sha256()
    for line in manifest_lines({k: v for k, v in hashes.items() if not is_view(k)}):
        h.update(line.encode())
    return f"sha256:{h.hexdigest()}"


def run_digest(report_dir: Path) -> str:
    """The evidence digest of ``report_dir`` as its files are now."""
    return evidence_digest(hash_tree(_directory(report_dir)))


def _directory(report_dir: Path) -> Path:
    if not report_dir.is_dir():
        raise ManifestError(f"{report_dir} is not a directory (expected a run's report folder)")
    return report_dir


def stamp_summary(report_dir: Path, digest: str) -> Path | None:
    """Record ``digest`` in summary.md (replacing an older digest line); None if
    the run has no summary."""
    path = report_dir / SUMMARY_NAME
    if not path.is_file():
        return None
    lines = bounded_read.read_text(path).splitlines()
    stamp = f"{DIGEST_LINE}{digest} (sha256 over {MANIFEST_NAME}'s lines of every file but "
    stamp += "this summary and the HTML pages; `fencecheck verify` checks it)"
    kept = [line for line in lines if not line.startswith(DIGEST_LINE)]
    # After the header's last "- **key**: value" line, before the table.
    at = max((i + 1 for i, line in enumerate(kept) if line.startswith("- **")), default=len(kept))
    kept.insert(at, stamp)
    atomic_write_text(path, "\n".join(kept) + "\n", mode=READABLE)
    return path


def write_manifest(report_dir: Path) -> Path:
    """Seal ``report_dir``: stamp the evidence digest into summary.md, then write
    ``MANIFEST.sha256`` over every file in it. Call it last, after everything
    the run writes (pages included); returns the manifest's path."""
    root = _directory(report_dir)
    stamp_summary(root, run_digest(root))
    path = root / MANIFEST_NAME
    atomic_write_text(path, "".join(manifest_lines(hash_tree(root))), mode=READABLE)
    return path


def read_manifest(path: Path) -> dict[str, str]:
    """The manifest's entries; ManifestError names the first line that is not one."""
    entries: dict[str, str] = {}
    # A line that is not an entry is named, never quoted: the file may be anything.
    for number, line in enumerate(bounded_read.read_text(path).splitlines(), start=1):
        digest, sep, rel = line.partition("  ")
        if not sep or not re.fullmatch(r"[0-9a-f]{64}", digest) or not rel:
            raise ManifestError(f"{path}:{number} is not a '<sha256>  <path>' line")
        entries[rel] = digest
    return entries


@dataclass
class Verification:
    """What `fencecheck verify` found; ``intact`` only when nothing is listed."""

    report_dir: Path
    files: int = 0
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    digest: str | None = None
    recorded: dict[str, str] = field(default_factory=dict)

    @property
    def intact(self) -> bool:
        return not (self.changed or self.removed or self.added or self.problems)

    def lines(self) -> list[str]:
        out = [f"  changed: {p}" for p in self.changed]
        out += [f"  removed: {p}" for p in self.removed]
        out += [f"  added:   {p}" for p in self.added]
        out += [f"  {p}" for p in self.problems]
        return out


def _text(path: Path) -> str:
    return bounded_read.read_bytes(path).decode("utf-8", errors="replace")


def recorded_digests(report_dir: Path) -> dict[str, str]:
    """The evidence digest as summary.md and index.html record it, by file name."""
    found: dict[str, str] = {}
    summary = report_dir / SUMMARY_NAME
    if summary.is_file():
        for line in _text(summary).splitlines():
            if line.startswith(DIGEST_LINE) and (m := DIGEST_RE.search(line)):
                found[SUMMARY_NAME] = m.group(0)
    index = report_dir / "index.html"
    if index.is_file() and (m := INDEX_DIGEST_RE.search(_text(index))):
        found["index.html"] = m.group(1)
    return found


def verify_report(report_dir: Path, *, expected_digest: str | None = None) -> Verification:
    """Re-hash ``report_dir`` against its manifest.

    Lists every file whose content changed, every listed file that is gone and
    every file the manifest does not list; checks that the digest summary.md
    and index.html record is the digest of the evidence as it is now; and, if
    given, that it equals ``expected_digest`` (a value kept outside).
    """
    root = _directory(report_dir)
    result = Verification(report_dir=root)
    manifest = root / MANIFEST_NAME
    now = hash_tree(root)
    result.digest = evidence_digest(now)
    if not manifest.exists():
        result.problems.append(f"no {MANIFEST_NAME}: this directory was never sealed")
    else:
        listed = read_manifest(manifest)
        result.files = len(listed)
        result.changed = [p for p in listed if p in now and now[p] != listed[p]]
        result.removed = [p for p in listed if p not in now]
        result.added = [p for p in now if p not in listed]
    result.recorded = recorded_digests(root)
    for name, recorded in result.recorded.items():
        if recorded != result.digest:
            result.problems.append(
                f"{name} records evidence digest {recorded}, the evidence hashes to {result.digest}"
            )
    if expected_digest is not None and expected_digest != result.digest:
        result.problems.append(
            f"expected evidence digest {expected_digest}, the evidence hashes to {result.digest}"
        )
    return result

"""Tamper evidence for a run directory: ``MANIFEST.sha256`` and the evidence digest.

``MANIFEST.sha256`` lists the sha256 of every file in the run directory (one
``<hex>  <path>`` line per file, sorted by path, the format ``sha256sum -c``
reads), so a changed, removed or added file is found by re-hashing. Its last
line, a comment ``sha256sum`` skips, is the sha256 of the lines above it: a
changed byte in the manifest itself is told from a changed file.

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
SEAL_LINE = (
    "# sha256 of the lines above: {} (sha256sum skips this line; fencecheck verify checks it)\n"
)
SEAL_RE = re.compile(r"# sha256 of the lines above: ([0-9a-f]{64})\b")
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
    body = "".join(manifest_lines(hash_tree(root)))
    seal = SEAL_LINE.format(hashlib.sha256(body.encode()).hexdigest())
    atomic_write_text(path, body + seal, mode=READABLE)
    return path


@dataclass
class Listing:
    """A manifest as read: its entries, the numbers of its lines that are not
    entries, and whether its seal line matches the lines above it (None: it
    has none, as manifests before seal lines did not)."""

    entries: dict[str, str] = field(default_factory=dict)
    bad_lines: list[int] = field(default_factory=list)
    sealed: bool | None = None


def read_manifest(path: Path) -> Listing:
    """The manifest at ``path``. A line that is not an entry is counted, never
    quoted (the file may be anything)."""
    data = bounded_read.read_bytes(path)
    # Split on "\n" only, as the manifest is written (str.splitlines would also
    # split a file name at "\r").
    lines = re.findall(r"[^\n]*\n|[^\n]+\Z", data.decode("utf-8", errors="replace"))
    listing = Listing()
    if lines and (seal := SEAL_RE.match(lines[-1])):
        body = data[: len(data) - len(lines[-1].encode())]
        listing.sealed = hashlib.sha256(body).hexdigest() == seal.group(1)
        lines = lines[:-1]
    for number, line in enumerate(lines, start=1):
        digest, sep, rel = line.rstrip("\n").partition("  ")
        if not sep or not re.fullmatch(r"[0-9a-f]{64}", digest) or not rel:
            listing.bad_lines.append(number)
        else:
            listing.entries[rel] = digest
    return listing


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
    # The manifest itself was changed after the seal: what shows it, then
    # each of its lines that disagrees with the folder.
    manifest_changed: list[str] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not (
            self.changed or self.removed or self.added or self.problems or self.manifest_changed
        )

    def lines(self) -> list[str]:
        out = [f"  {p}" for p in self.manifest_changed]
        out += [f"  changed: {p}" for p in self.changed]
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
    result.recorded = recorded_digests(root)
    if not manifest.exists():
        result.problems.append(f"no {MANIFEST_NAME}: this directory was never sealed")
    else:
        listing = read_manifest(manifest)
        listed = listing.entries
        result.files = len(listed)
        result.changed = [p for p in listed if p in now and now[p] != listed[p]]
        result.removed = [p for p in listed if p not in now]
        result.added = [p for p in now if p not in listed]
        result.manifest_changed = _manifest_changes(listing, result)
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


def _manifest_changes(listing: Listing, result: Verification) -> list[str]:
    """What shows that the manifest itself changed after the seal: its seal
    line, lines that are not entries, or evidence lines that no longer give
    the evidence digest summary.md and index.html record while the files do.
    When the files still give that digest, the mismatches are the manifest's
    lines, not changed files: they move from ``result.changed`` (and removed,
    added) to the returned lines."""
    signs: list[str] = []
    if listing.sealed is False:
        signs.append(
            f"{MANIFEST_NAME} itself was changed after the seal: its lines no longer hash to "
            "the sha256 on its last line"
        )
    if listing.bad_lines:
        shown = ", ".join(map(str, listing.bad_lines[:10]))
        more = f" and {len(listing.bad_lines) - 10} more" if len(listing.bad_lines) > 10 else ""
        signs.append(f"{MANIFEST_NAME} line(s) {shown}{more} are not '<sha256>  <path>' lines")
    recorded = set(result.recorded.values())
    files_as_recorded = recorded == {result.digest}
    if files_as_recorded and evidence_digest(listing.entries) != result.digest:
        signs.append(
            f"{MANIFEST_NAME} no longer gives the evidence digest "
            f"{' and '.join(result.recorded)} record, while the files still do"
        )
    if not signs or not files_as_recorded:
        return signs  # both changed, or only files: each mismatch is listed as it is
    signs.append(
        f"the evidence still hashes to the digest {' and '.join(result.recorded)} record: "
        f"the files are as sealed, {MANIFEST_NAME} is what changed"
    )
    signs += [f"{MANIFEST_NAME}'s line for {p} does not match the file" for p in result.changed]
    signs += [f"{MANIFEST_NAME} lists {p}, which is not in the folder" for p in result.removed]
    signs += [f"{MANIFEST_NAME} does not list {p}" for p in result.added]
    result.changed, result.removed, result.added = [], [], []
    return signs

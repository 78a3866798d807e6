"""Evidence archives: one YAML file per experiment run.

An archive is validated against the published JSON Schema
(``harness/evidence/schemas/evidence-archive.schema.json``) before it is written, is
written atomically (temp file, fsync, rename) so a reader never sees half of
one, and carries nothing secret in clear text (see :func:`mask`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).parent / "schemas" / "evidence-archive.schema.json"
REPO_ROOT = Path(__file__).resolve().parents[2]

# Keys whose values never appear in an archive. Request bodies and
# checkpoints may carry user data (Chinese seed section 12).
SECRET_KEY = re.compile(
    r"password|passwd|secret|api[_-]?key|authorization|credential|card[_-]?number|cvv|ssn"
    r"|access[_-]?token|auth[_-]?token|refresh[_-]?token|bearer",
    re.I,
)
SECRET_IN_TEXT = re.compile(r"(password|passwd|secret|token)=([^\s&]+)", re.I)
MASK = "***masked***"


class ArchiveInvalid(ValueError):
    """The evidence archive does not match the published schema."""


@cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return loaded


def mask(value: Any) -> Any:
    """A copy of ``value`` with secret-looking keys and ``key=value`` pairs masked.

    Bare "token" or "pass" are not secret words here: the archive must keep
    the fencing token and ``pass_or_fail``. Only string values are masked.
    """
    if isinstance(value, dict):
        return {
            k: (MASK if isinstance(v, str) and SECRET_KEY.search(str(k)) else mask(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [mask(v) for v in value]
    if isinstance(value, str):
        return SECRET_IN_TEXT.sub(lambda m: f"{m.group(1)}={MASK}", value)
    return value


def to_plain(value: Any) -> Any:
    """Plain YAML-safe data: datetimes, UUIDs, Decimals and the like as strings."""
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [to_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def validate(archive: dict[str, Any]) -> None:
    """ArchiveInvalid listing what does not match the schema: the missing fields
    in one line, then up to ten other mismatches with their paths."""
    errors = sorted(
        jsonschema.Draft202012Validator(schema()).iter_errors(archive), key=lambda e: e.path
    )
    if not errors:
        return
    missing = [
        str(e.message).split("'")[1]
        for e in errors
        if e.validator == "required" and not e.path and "'" in str(e.message)
    ]
    others = [e for e in errors if not (e.validator == "required" and not e.path)]
    lines = [f"  missing field(s): {', '.join(missing)}"] if missing else []
    lines += [f"  {'/'.join(map(str, e.path)) or '(top)'}: {e.message}" for e in others[:10]]
    raise ArchiveInvalid("evidence archive does not match its schema:\n" + "\n".join(lines))


def write_archive(path: Path, archive: dict[str, Any]) -> Path:
    """Mask, validate and atomically write ``archive`` as YAML to ``path``."""
    clean = to_plain(mask(archive))
    validate(clean)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(clean, f, sort_keys=False, allow_unicode=True, width=100)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_archive(path: Path) -> dict[str, Any]:
    """The YAML mapping in ``path``; ArchiveInvalid (saying what is wrong) when the
    file is not text, not YAML, or not a mapping."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArchiveInvalid(
            f"{path} is not an evidence archive: it is not UTF-8 text (byte {exc.start} "
            "cannot be decoded); archives are YAML files in reports/<run>/archives/"
        ) from None
    except OSError as exc:
        raise ArchiveInvalid(f"{path} cannot be read: {exc.strerror or exc}") from None
    if "\x00" in text:
        raise ArchiveInvalid(f"{path} is not an evidence archive: it is a binary file")
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ArchiveInvalid(
            f"{path} is not valid YAML{where}: {problem} (a truncated or edited archive?)"
        ) from None
    if not isinstance(loaded, dict):
        kind = "empty" if loaded is None else f"a {type(loaded).__name__}"
        raise ArchiveInvalid(
            f"{path} is not an evidence archive: its top level is {kind}, not a mapping"
        )
    return loaded


def load_archive(path: Path) -> dict[str, Any]:
    """:func:`read_archive`, then checked against the published schema: what
    ``fencecheck show`` reads. ArchiveInvalid lists what does not match."""
    archive = read_archive(path)
    try:
        validate(archive)
    except ArchiveInvalid as exc:
        raise ArchiveInvalid(f"{path}: {exc} (schema: {SCHEMA_PATH})") from None
    return archive


# ------------------------------------------------------------ provenance
@cache
def git_commit() -> str:
    """The commit the harness runs from, marked dirty when the tree has changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{head}{'-dirty' if dirty else ''}"


@cache
def go_version() -> str | None:
    go = shutil.which("go")
    if go is None:
        return None
    try:
        return subprocess.run(
            [go, "version"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def runtime_versions(*, go_worker: bool, toxiproxy: str | None) -> dict[str, str | None]:
    versions: dict[str, str | None] = {
        "python": platform.python_version(),
        "toxiproxy": toxiproxy,
    }
    if go_worker:
        versions["go"] = go_version()
    return versions


def digest_paths(paths: Iterable[Path]) -> str:
    """sha256 over the contents of files (directories walked in sorted order)."""
    h = hashlib.sha256()
    for root in sorted(paths):
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for file in files:
            if "__pycache__" in file.parts:
                continue
            h.update(str(file.relative_to(root.parent)).encode())
            h.update(b"\0")
            h.update(file.read_bytes())
    return f"sha256:{h.hexdigest()}"


@cache
def worker_digest(argv: tuple[str, ...]) -> str:
    """A digest of what the worker command runs, computed once per command.

    For the reference implementation: its whole package. For another command:
    the executable and every argument that names an existing file.
    """
    if "reference_impl" in " ".join(argv):
        return digest_paths([REPO_ROOT / "reference_impl"])
    files = [Path(p) for p in argv if Path(p).is_file()]
    exe = shutil.which(argv[0])
    if exe:
        files.append(Path(exe).resolve())
    if not files:
        return "sha256:" + hashlib.sha256(" ".join(argv).encode()).hexdigest()
    return digest_paths(files)

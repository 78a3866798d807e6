"""Evidence archives: one YAML file per experiment run.

An archive is validated against the published JSON Schema
(``harness/evidence/schemas/evidence-archive.schema.json``) before it is written, is
written atomically (temp file, fsync, rename) so a reader never sees half of
one, and carries nothing secret in clear text (see :func:`mask`).
"""

from __future__ import annotations

import dataclasses
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

from harness.evidence import bounded_read, written
from harness.evidence.yaml_emit import emit_yaml

SCHEMA_PATH = Path(__file__).parent / "schemas" / "evidence-archive.schema.json"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Where a copy without git (the fencecheck container image) keeps its commit.
COMMIT_FILE = ".fencecheck-commit"

# Keys whose values never appear in an archive. Request bodies and
# checkpoints may carry user data (Chinese seed section 12).
SECRET_KEY = re.compile(
    r"password|passwd|secret|api[_-]?key|authorization|credential|card[_-]?number|cvv|ssn"
    r"|access[_-]?token|auth[_-]?token|refresh[_-]?token|bearer",
    re.I,
)
SECRET_IN_TEXT = re.compile(r"(password|passwd|secret|token)=([^\s&]+)", re.I)
# Values that are secret whatever key they sit under: bearer credentials,
# API keys of the usual shapes, JWTs, PEM private keys.
SECRET_VALUE = re.compile(
    r"Bearer\s+[A-Za-z0-9._~+/-]{8,}=*"
    r"|\b(?:sk|pk|rk|tok)_(?:live|test)_[A-Za-z0-9]{8,}\b"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"
)
MASK = "***masked***"
# What a string must contain for SECRET_VALUE or SECRET_IN_TEXT to match in it.
_SECRET_NEEDS = ("=", "Bearer", "_live_", "_test_", "eyJ", "PRIVATE KEY")


class ArchiveInvalid(ValueError):
    """The evidence archive does not match the published schema."""


@cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return loaded


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def mask(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A plain copy of ``value`` (datetimes, UUIDs, Decimals and the like as
    strings, keys as strings, tuples and sets as lists) with secrets masked: by key
    name, ``key=value`` pairs, value shapes (:data:`SECRET_VALUE`), and every
    occurrence of a value known to be secret (``secrets``: what the harness
    itself planted or handed out, e.g. a data key, a sensitive run input),
    wherever it appears. One walk does both: an archive has hundreds of
    thousands of values.

    Bare "token" or "pass" are not secret words here: the archive must keep
    the fencing token and ``pass_or_fail``. Only string values are masked.
    """
    known = sorted({s for s in secrets if len(s) >= 6}, key=len, reverse=True)
    # Most strings of an archive hold nothing to mask; a few substring tests
    # say so before any pattern runs (each pattern below needs one of them).
    return _Masker(known, (*known, *_SECRET_NEEDS)).plain(value)


class _Masker:
    def __init__(self, known: list[str], needs: tuple[str, ...]) -> None:
        self.known = known
        self.needs = needs
        self.secret_keys: dict[str, bool] = {}

    def plain(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                key = k if isinstance(k, str) else str(k)
                secret = self.secret_keys.get(key)
                if secret is None:
                    secret = self.secret_keys[key] = SECRET_KEY.search(key) is not None
                v = self.plain(v)
                out[key] = MASK if secret and isinstance(v, str) else v
            return out
        if isinstance(value, list | tuple | set):
            return [self.plain(v) for v in value]
        if value is None or isinstance(value, bool | int | float):
            return value
        return self.text(str(value))

    def text(self, value: str) -> str:
        if not any(part in value for part in self.needs):
            return value
        for secret in self.known:
            if secret in value:
                value = value.replace(secret, MASK)
        value = SECRET_VALUE.sub(MASK, value)
        return SECRET_IN_TEXT.sub(lambda m: f"{m.group(1)}={MASK}", value)


def fields_of(obj: Any) -> dict[str, Any]:
    """``dataclasses.asdict`` without its deep copy of every leaf (a copy of
    each string and number of a run's histories and query results, made
    only for :func:`mask` to copy them again): the same dicts, lists and
    tuples, the leaves shared."""
    kind = type(obj)
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in dataclasses.fields(obj))
    return {name: _field_value(getattr(obj, name)) for name in names}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_value(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float):
        return value
    if isinstance(value, list):
        return [_field_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _field_value(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return fields_of(value)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_field_value(v) for v in value)
    return value


def validate(archive: dict[str, Any]) -> None:
    """ArchiveInvalid listing what does not match the schema: the missing fields
    in one line, then up to ten other mismatches with their paths."""
    errors = sorted(_validator().iter_errors(archive), key=lambda e: e.path)
    if not errors:
        return
    missing = [
        str(e.message).split("'")[1]
        for e in errors
        if e.validator == "required" and not e.path and "'" in str(e.message)
    ]
    others = [e for e in errors if not (e.validator == "required" and not e.path)]
    lines = [f"  missing field(s): {', '.join(missing)}"] if missing else []
    lines += [_mismatch(e) for e in others[:10]]
    raise ArchiveInvalid("evidence archive does not match its schema:\n" + "\n".join(lines))


def _mismatch(error: jsonschema.ValidationError) -> str:
    """One schema mismatch as a line that quotes no more of the archive than a
    short offending value or field name (the file may be anything)."""
    where = "/".join(
        str(p) if isinstance(p, int) or bounded_read.is_word(p) else "?" for p in error.path
    )
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        extra = [k for k in error.instance if k not in known]
        return f"  {where or '(top)'}: unexpected field(s) {bounded_read.field_names(extra)}"
    message = error.message
    quoted = repr(error.instance)
    if message.startswith(quoted):
        message = bounded_read.token(error.instance) + message[len(quoted) :]
    line = message.splitlines()[0] if message else ""
    return f"  {where or '(top)'}: {line[:160]}"


def write_archive(path: Path, archive: dict[str, Any], secrets: Iterable[str] = ()) -> Path:
    """Mask (``secrets``: values known to be secret), validate and atomically
    write ``archive`` as YAML to ``path``."""
    clean = mask(archive, secrets)
    validate(clean)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = emit_yaml(clean)
    atomic_write_text(path, text)
    written.remember(path, text, clean)
    return path


def atomic_write_text(path: Path, text: str, *, mode: int | None = None) -> Path:
    """Write ``text`` to ``path`` through a synced temp file and a rename: a
    reader sees the old file or the whole new one, never half of it. ``mode``
    None keeps the temp file's owner-only mode; pages and summaries pass 0o644."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        if mode is not None:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, mode & ~umask)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_archive(path: Path, name: str | None = None) -> dict[str, Any]:
    """The YAML mapping in ``path``; ArchiveInvalid (saying what is wrong, about
    ``name``, default the path) when the file is not text, not YAML, or not a
    mapping. FileRefused (harness.evidence.bounded_read) when it is not a
    regular file, too large or too deep."""
    shown = name or str(path)
    try:
        data = bounded_read.read_bytes(path)
    except OSError as exc:
        raise ArchiveInvalid(f"{shown} cannot be read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArchiveInvalid(
            f"{shown} is not an evidence archive: it is not UTF-8 text (byte {exc.start} "
            "cannot be decoded); archives are YAML files in reports/<run>/archives/"
        ) from None
    if "\x00" in text:
        raise ArchiveInvalid(f"{shown} is not an evidence archive: it is a binary file")
    try:
        loaded = bounded_read.parse_yaml(text, path)
    except bounded_read.NotParsed as exc:
        raise ArchiveInvalid(
            f"{shown} is not valid YAML{exc.detail} (a truncated or edited archive?)"
        ) from None
    if not isinstance(loaded, dict):
        kind = "empty" if loaded is None else f"a {type(loaded).__name__}"
        raise ArchiveInvalid(
            f"{shown} is not an evidence archive: its top level is {kind}, not a mapping"
        )
    return loaded


def load_archive(path: Path, name: str | None = None) -> dict[str, Any]:
    """:func:`read_archive`, then checked against the published schema: what
    ``fencecheck show``, the pages and a comparison read. ArchiveInvalid lists
    what does not match."""
    archive = read_archive(path, name)
    try:
        validate(archive)
    except ArchiveInvalid as exc:
        published = SCHEMA_PATH.relative_to(REPO_ROOT)
        raise ArchiveInvalid(f"{name or path}: {exc} (schema: {published})") from None
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
        try:
            return (REPO_ROOT / COMMIT_FILE).read_text().strip()
        except OSError:
            return "unknown (not a git checkout)"
    return f"{head}{'-dirty' if dirty else ''}"


@cache
def fencecheck_version() -> str:
    """The installed fencecheck package's version (pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fencecheck")
    except PackageNotFoundError:
        return "unknown (not installed)"


@cache
def go_build_version(argv: tuple[str, ...]) -> str | None:
    """The Go version a worker binary was built with (``go version BINARY``), or
    None when the worker command is not a Go binary (or Go is not installed)."""
    go = shutil.which("go")
    exe = shutil.which(argv[0]) if argv else None
    if go is None or exe is None:
        return None
    try:
        out = subprocess.run(
            [go, "version", exe], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    _, _, version = out.rpartition(": ")
    return version or None


def runtime_versions(*, go_worker: str | None, toxiproxy: str | None) -> dict[str, str | None]:
    """``go_worker``: the Go version the worker under test was built with, if it is Go."""
    versions: dict[str, str | None] = {
        "python": platform.python_version(),
        "toxiproxy": toxiproxy,
    }
    if go_worker:
        versions["go"] = go_worker
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

    For the Python reference implementation (``-m reference_impl.worker``): its
    whole package. For another command (the Go worker's binary included): the
    executable and every argument that names an existing file.
    """
    if "reference_impl.worker" in argv:
        return digest_paths([REPO_ROOT / "reference_impl"])
    files = [Path(p) for p in argv if Path(p).is_file()]
    exe = shutil.which(argv[0])
    if exe:
        files.append(Path(exe).resolve())
    if not files:
        return "sha256:" + hashlib.sha256(" ".join(argv).encode()).hexdigest()
    return digest_paths(files)

"""Reading a file someone else may have made: every reader of the tool goes through here.

Archives, schedules, manifests, triage files, shard records and results come
from disk, and a disk can hold anything: a FIFO that never answers, a
symlink to /dev/zero, 200 MB of YAML, YAML nested 100 000 deep, /etc/shadow.
Invariants of what this module hands back or raises:

* Only a regular file is read. The path is opened with ``O_NONBLOCK`` and
  checked with ``fstat`` on the open descriptor, so a FIFO never blocks the
  open, and a symlink is followed and its target checked, not its name.
* At most :func:`max_bytes` (16 MiB unless ``FENCECHECK_READ_CAP_MB`` says
  otherwise) are read into memory; parsed documents (YAML, JSON) nest at most
  :data:`MAX_DEPTH` levels and expand (YAML aliases) to no more nodes than
  the file has bytes, twice over.
* What breaks these rules raises :class:`FileRefused`: one line naming the
  file, what it is, and the cap. It is not a ``ValueError``, so no reader
  turns it into "this archive is unreadable": the command stops with a usage
  error (exit 64).
* A file that is read but does not parse raises :class:`NotParsed` (a
  ``ValueError``) whose message names the place (line, column, byte) and at
  most the offending token (:func:`token`), never the file's lines.

Hashing (``fencecheck verify``) streams a file through :func:`regular_file`
without the size cap: a log may be large, and hashing holds one chunk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import yaml

DEFAULT_CAP_MB = 16
CAP_VARIABLE = "FENCECHECK_READ_CAP_MB"
# Archives nest 8 levels (measured on a full matrix run); what a worker puts
# in a request body or a checkpoint sits 3 to 5 levels below the top.
MAX_DEPTH = 64
TOKEN_CHARS = 32
_WORD = re.compile(rf"[\w.+-]{{0,{TOKEN_CHARS}}}")
_CHUNK = 1 << 20
_MIB = 1 << 20

# libyaml's loader: its parser is iterative C, so depth never reaches
# Python's recursion limit before the depth check below.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class FileRefused(Exception):
    """The file is not one the tool reads: not a regular file, larger than the
    cap, or nested deeper than the cap (a usage error naming file and cap)."""


class NotParsed(ValueError):
    """The file was read but is not the text, YAML or JSON it should be;
    ``detail`` says where and what (`` at line 3, column 1: ...``)."""

    def __init__(self, path: Path, what: str, detail: str = "") -> None:
        super().__init__(f"{path} is not {what}{detail}")
        self.detail = detail


def max_bytes() -> int:
    """The size cap on one file read into memory, in bytes."""
    raw = os.environ.get(CAP_VARIABLE)
    if raw is None:
        return DEFAULT_CAP_MB * _MIB
    try:
        mb = int(raw)
    except ValueError:
        mb = 0
    if mb < 1:
        raise FileRefused(f"{CAP_VARIABLE}={raw!r} is not a whole number of MiB (1 or more)")
    return mb * _MIB


def cap_text(limit: int | None = None) -> str:
    """The size cap as an error names it, with how to raise it."""
    mb = (limit or max_bytes()) // _MIB
    return f"the {mb} MiB cap on a file fencecheck reads ({CAP_VARIABLE} raises it)"


def is_word(value: object) -> bool:
    """A short name or number an error may quote as it is."""
    return isinstance(value, str) and _WORD.fullmatch(value) is not None


def token(value: object) -> str:
    """``value`` as an error may quote it: a short word or number as it is, any
    other text only by its length (it may be a line of anything)."""
    if isinstance(value, str):
        return repr(value) if is_word(value) else f"a {len(value)}-character text"
    if value is None or isinstance(value, bool | int | float):
        return repr(value)[:TOKEN_CHARS]
    return f"a {type(value).__name__}"


def field_names(keys: Iterable[object]) -> str:
    """Unexpected keys as an error may name them: those that look like field
    names (five at most), the others only counted (a file that is not the
    document at all, /etc/shadow, has whole lines as keys)."""
    listed = sorted(map(str, keys))
    named = [k for k in listed if is_word(k)]
    others = len(listed) - len(named)
    shown = ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
    if others:
        shown += f"{' and ' if named else ''}{others} key(s) that are not field names"
    return shown


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _named(path: Path) -> str:
    """The path, and where it leads when it is a symlink."""
    if path.is_symlink():
        return f"{path} (a symlink to {os.path.realpath(path)})"
    return str(path)


def _not_regular(path: Path, mode: int) -> FileRefused:
    return FileRefused(
        f"{_named(path)} is {_kind(mode)}, not a regular file: fencecheck reads only "
        "regular files (name one, or remove this from the folder)"
    )


@contextlib.contextmanager
def regular_file(path: Path) -> Iterator[tuple[BinaryIO, int]]:
    """``path`` open for reading, with its size, when it is a regular file
    (after following symlinks); FileRefused when it is anything else. An
    OSError of the open itself (missing, no permission) is the caller's."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: a socket, or a device without a driver
            raise
        raise _not_regular(path, os.stat(path).st_mode) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(path, info.st_mode)
        os.set_blocking(fd, True)
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with file:
        yield file, info.st_size


def _too_big(path: Path, size: str, limit: int) -> FileRefused:
    return FileRefused(f"{_named(path)} is {size}, over {cap_text(limit)}")


def read_bytes(path: Path) -> bytes:
    """The whole of a regular file no larger than :func:`max_bytes`."""
    limit = max_bytes()
    with regular_file(path) as (file, size):
        if size > limit:
            raise _too_big(path, f"{size / _MIB:.1f} MiB", limit)
        data = file.read(limit + 1)  # its size may have grown since fstat
    if len(data) > limit:
        raise _too_big(path, "larger than that", limit)
    return data


def read_text(path: Path) -> str:
    """:func:`read_bytes` as UTF-8 text; NotParsed names the first byte that is not."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotParsed(path, "UTF-8 text", f" (byte {exc.start} cannot be decoded)") from None


def sha256_hex(path: Path) -> str:
    """sha256 of a regular file of any size, read in chunks."""
    import hashlib

    digest = hashlib.sha256()
    with regular_file(path) as (file, _size):
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def copy_file(source: Path, target: Path) -> None:
    """Copy a regular file (of any size) with its mode and times: ``shutil.copy2``
    that refuses a FIFO or a device instead of reading it forever."""
    import shutil

    with regular_file(source) as (file, _size), open(target, "wb") as out:
        shutil.copyfileobj(file, out, _CHUNK)
    shutil.copystat(source, target)


# ------------------------------------------------------------ documents
def yaml_problem(exc: yaml.YAMLError) -> str:
    """`` at line L, column C: <problem>``: a YAML error in one line, without
    the lines of the file (PyYAML's own message quotes them)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: {problem[:120]}"


def _deeper(path: Path) -> FileRefused:
    return FileRefused(
        f"{path} nests deeper than {MAX_DEPTH} levels, the cap on a document fencecheck reads"
    )


def check_shape(value: Any, path: Path, size: int) -> None:
    """FileRefused when ``value`` nests deeper than MAX_DEPTH, or holds more
    nodes than ``2 * size + 100`` (aliases that expand a small file)."""
    budget = 2 * size + 100
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    nodes = 0
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _deeper(path)
        children = node.values() if isinstance(node, dict) else node
        nodes += len(children)
        if nodes > budget:
            raise FileRefused(
                f"{path} expands to more than {budget} values (YAML aliases?); a file "
                "fencecheck reads holds no more values than it has bytes"
            )
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def parse_yaml(text: str, path: Path) -> Any:
    """The YAML document in ``text`` (read from ``path``), checked by :func:`check_shape`;
    NotParsed (one line: where, and what) when it is not YAML."""
    try:
        loaded = yaml.load(text, Loader=_LOADER)
    except RecursionError:
        raise _deeper(path) from None
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(getattr(exc, "problem", "")):
            raise _deeper(path) from None  # libyaml's own cap (1000) came first
        raise NotParsed(path, "valid YAML", yaml_problem(exc)) from None
    check_shape(loaded, path, len(text))
    return loaded


def load_yaml(path: Path) -> Any:
    """:func:`read_text` then :func:`parse_yaml`."""
    return parse_yaml(read_text(path), path)


def parse_json(text: str, path: Path) -> Any:
    """The JSON document in ``text`` (read from ``path``), checked by :func:`check_shape`."""
    try:
        loaded = json.loads(text)
    except RecursionError:
        raise _deeper(path) from None
    except ValueError as exc:
        where = (
            f" at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            if isinstance(exc, json.JSONDecodeError)
            else ""
        )
        raise NotParsed(path, "valid JSON", where) from None
    check_shape(loaded, path, len(text))
    return loaded


def load_json(path: Path) -> Any:
    """:func:`read_text` then :func:`parse_json`."""
    return parse_json(read_text(path), path)

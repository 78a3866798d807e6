"""Versioned schema migrations (``sql/migrations/NNN_name.sql``).

Invariants:
- Each file is applied once per database, in version order, each in its own
  transaction together with its row in ``fencecheck_migrations``; an applied
  file whose text changed afterwards is refused (MigrationChanged).
- Concurrent migrations of ONE database serialize on an advisory lock;
  concurrent migrations of several databases of one cluster are safe because
  the only cluster-global objects (roles) are created idempotently in SQL.
- Overlays (a mutant's replacement SQL functions or grants) are applied
  after the migrations, every time, preceded by the function-grants file
  again; ``CREATE OR REPLACE`` keeps a function's owner and grants, so an
  overlay changes exactly what it says, grants included.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from reference_impl.errors import MigrationChanged

MIGRATION_DIR = Path(__file__).parent / "sql" / "migrations"
PRIVILEGES_FILE = "010_function_grants.sql"
# Any fixed key: only migrations of this schema take it.
_LOCK_KEY = 0x46454E4345  # "FENCE"
_FILE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def available(directory: Path = MIGRATION_DIR) -> list[Migration]:
    """All migration files, in version order (versions must be unique)."""
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if not match:
            raise ValueError(f"migration file {path.name} is not named NNN_name.sql")
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"two migrations with version {version}")
        found[version] = Migration(version, match.group(2), path)
    return [found[v] for v in sorted(found)]


def _execute_file(conn: psycopg.Connection[tuple[object, ...]], text: str) -> None:
    # Migration files are trusted package data, and may hold several statements.
    conn.execute(text.encode(), prepare=False)


def migrate(admin_dsn: str, overlays: Sequence[Path] = ()) -> list[str]:
    """Apply pending migrations (then overlays); return the names applied."""
    applied: list[str] = []
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", [_LOCK_KEY])
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS public.fencecheck_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )
            rows = conn.execute("SELECT version, checksum FROM public.fencecheck_migrations")
            done = {int(v): str(c) for v, c in rows.fetchall()}
            for m in available():
                if m.version in done:
                    if done[m.version] != m.checksum:
                        raise MigrationChanged(
                            f"migration {m.path.name} changed after it was applied"
                        )
                    continue
                with conn.transaction():
                    _execute_file(conn, m.text)
                    conn.execute(
                        "INSERT INTO public.fencecheck_migrations (version, name, checksum)"
                        " VALUES (%s, %s, %s)",
                        [m.version, m.name, m.checksum],
                    )
                applied.append(m.path.name)
            if overlays:
                with conn.transaction():
                    _execute_file(conn, (MIGRATION_DIR / PRIVILEGES_FILE).read_text("utf-8"))
                    for path in overlays:
                        _execute_file(conn, path.read_text(encoding="utf-8"))
                        applied.append(f"overlay:{path.name}")
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", [_LOCK_KEY])
    return applied

"""The run's PostgreSQL secret: password authentication that only the run can pass.

Every server of a run listens on 127.0.0.1, which every local user can reach;
with ``trust`` any of them could log in as the superuser and rewrite a run's
evidence. So a run draws one random secret; every role it makes (the
superuser at initdb, each login role of an experiment) has it as its
password, and every server asks for it (``scram-sha-256``). The secret lives
in a libpq passfile in the run's temp root (mode 0600, in a 0700
directory): only the run's own OS user reads it, the harness and the
workers name it with ``passfile=`` in their DSNs (and ``PGPASSFILE``), and no
DSN, archive, log or report carries the secret itself (the harness masks it
wherever it could show). A server's own connections (a standby's WAL
receiver, pg_basebackup) get it inside the cluster's private data directory
or their environment, which other users cannot read either.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from harness.parts.os_user import OsUser, give_to

PASSFILE = "pgpass"


@dataclass(frozen=True)
class PgAuth:
    """One run's secret and the passfile that holds it."""

    password: str
    passfile: Path

    @classmethod
    def create(cls, directory: Path) -> PgAuth:
        """A fresh secret, written to ``directory``/pgpass (0600) for every host,
        port, database and role of the run."""
        password = secrets.token_urlsafe(24)  # no ':' or '\\': nothing to escape
        path = directory / PASSFILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"*:*:*:*:{password}\n")
        return cls(password, path)

    def pwfile_for(self, user: OsUser, directory: Path) -> Path:
        """The secret alone in a file ``user`` can read (initdb --pwfile runs
        as the server's user); the caller removes it after use."""
        path = directory / f".pw-{secrets.token_hex(4)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.password + "\n")
        give_to(path, user)
        return path

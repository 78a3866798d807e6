"""A throwaway PostgreSQL primary for the Go worker's unit tests (``go test``).

Started by the tests themselves (internal/pgtest): the harness's own
binaries and cluster driver (as root, the server runs as the ``postgres``
OS user). Prints the superuser DSN on one line, then serves until its stdin
closes (the test process ended, however it ended) and removes everything.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from harness.parts.pg_binaries import find_pg_binaries  # noqa: E402
from harness.parts.postgres import PostgresCluster  # noqa: E402


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="fencecheck-gotest-"))
    try:
        cluster = PostgresCluster.init_primary(find_pg_binaries(), root / "pg", name="gotest")
        try:
            print(cluster.admin_dsn(), flush=True)
            sys.stdin.read()
        finally:
            cluster.remove()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

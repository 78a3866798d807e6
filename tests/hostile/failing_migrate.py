"""A worker whose ``migrate`` fails (exit 3, a reason on stderr).

`fencecheck run --worker-cmd` must end with exit 2 and one paragraph naming
the command, the exit code and the last stderr lines, keeping migrate's
output in the report; `fencecheck contract` must report it as the gap of
contract section 1 (exit 1), never as a Python traceback.
"""

from __future__ import annotations

import sys

from reference_impl import worker

if __name__ == "__main__":
    if sys.argv[1:2] == ["migrate"]:
        print("applying 001_roles.sql", flush=True)
        print('migrate: relation "agent_runs" already exists (simulated)', file=sys.stderr)
        print("migrate: giving up", file=sys.stderr)
        sys.exit(3)
    sys.exit(worker.main())

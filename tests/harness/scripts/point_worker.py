"""A tiny worker for the control tests: visits injection points in order.

Usage: point_worker.py POINT [POINT ...]. For each point it records an
`invoke` event, calls `injection.point`, then records an `ok` event, so a
test can see from the history alone whether the worker got past a point.
"""

from __future__ import annotations

import sys

from harness import injection


def main(points: list[str]) -> int:
    for number, name in enumerate(points, start=1):
        injection.record("invoke", name, run_id="run-1", epoch=number, revision=number)
        injection.point(name, run_id="run-1", epoch=number, revision=number, operation_id=None)
        injection.record("ok", name, run_id="run-1", epoch=number, revision=number)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A worker whose `run` mode loops forever (a busy retry that never gives up):
it claims nothing and never exits. The experiment waiting for it must fail the
bound it broke, named with the evidence, never end *unknown* as a harness
error (issue: no worker behaviour hides a fail)."""

from __future__ import annotations

import sys
import time
from typing import Any

from reference_impl import worker
from reference_impl.runner import Runner


def spin_forever(self: Runner, *args: Any, **kwargs: Any) -> int:
    while True:  # "retry" without end or backoff
        time.sleep(0.01)


if __name__ == "__main__":
    Runner.run = spin_forever  # type: ignore[method-assign]
    sys.exit(worker.main())

"""A worker whose ``save_checkpoint`` answers ok and writes nothing.

Experiment A must fail: "committed together" over zero checkpoints is not ok.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from reference_impl import worker
from reference_impl.ops import Ctx, OpsServer


def save_nothing(self: OpsServer, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    event_id = str(args.get("event_id") or uuid.uuid4())
    return {"revision": int(args["expected_revision"]) + 1, "event_id": event_id}


if __name__ == "__main__":
    OpsServer.save_checkpoint = save_nothing  # type: ignore[method-assign]
    sys.exit(worker.main())

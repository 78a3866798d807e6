"""A worker whose ``save_checkpoint`` reply leaves out the documented ``event_id``.

The write itself is correct; only the reply is short. `fencecheck contract`
must name the missing field against ops.schema.json (contract section 5),
and `fencecheck run --worker-cmd` must stop with that report instead of
ending experiments that read the field in harness errors.
"""

from __future__ import annotations

import sys
from typing import Any

from reference_impl import worker
from reference_impl.ops import Ctx, OpsServer

_save = OpsServer.save_checkpoint


def save_without_event_id(self: OpsServer, ctx: Ctx, args: dict[str, Any]) -> dict[str, Any]:
    reply = _save(self, ctx, args)
    reply.pop("event_id", None)
    return reply


if __name__ == "__main__":
    OpsServer.save_checkpoint = save_without_event_id  # type: ignore[method-assign]
    sys.exit(worker.main())

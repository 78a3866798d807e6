"""A worker whose reconciler resends an unknown operation, whatever the tool promises.

F[unknown] builds its starting state with the worker's own ``reconcile``: the
resend shows in the tool's log on the way, so the verdict must be *fail*
(global invariants), never *unknown* because the ledger is no longer unknown.
"""

from __future__ import annotations

import sys
from typing import Any

from mock_tool.errors import ToolError
from reference_impl import worker
from reference_impl.cancellation import Cancellation
from reference_impl.db import Conn
from reference_impl.ledger import Reconciler
from reference_impl.protocol import Protocol


class Resending(Reconciler):
    def reconcile_one(
        self, conn: Conn, row: dict[str, Any], cancel: Cancellation | None = None
    ) -> dict[str, Any] | None:
        del cancel
        op_id = str(row["operation_id"])
        try:
            res = self.dispatcher.tools.create(
                str(row["tool_name"]), op_id, str(row["run_id"]), 1, dict(row["request_body"])
            )
        except ToolError:
            return None
        status = self.ledger.converge(
            conn, op_id, int(row["revision"]), "succeeded", res.resource_id, {}, {"resent": True}
        )
        return {"operation_id": op_id, "from": "unknown", "to": status}


if __name__ == "__main__":
    Protocol.reconciler_cls = Resending
    sys.exit(worker.main())

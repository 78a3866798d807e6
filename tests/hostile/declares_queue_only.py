"""The reference worker declaring itself a bare queue (contract section 14).

Its mapping says it has no progress writes, ledger, outbox, consumer, tenant
policy, operator actions or built-in workflow, renews per process and
hosts two injection points. What it does is the reference worker's. The
experiments that need what it says it lacks must end *not applicable*
naming it, and those that judge the queue layer (B, K, R) must still run:
the missing fencing token of a queue is no excuse either (``fencing_token:
false`` here).
"""

from __future__ import annotations

import sys

from reference_impl import worker

MAPPING = """\
mapping: 1
system:
  name: a bare queue (the reference worker, declaring less)
layer: queue
capabilities:
  fencing_token: false
  revision_check: false
  checkpoints: false
  renewal: per_process
  ledger: false
  outbox: false
  consumer_dedupe: false
  tenants: none
  operator_actions: false
  workflow: false
  injection_points: [after_lease_acquired, before_renew]
"""

if __name__ == "__main__":
    if sys.argv[1:2] == ["mapping"]:
        sys.stdout.write(MAPPING)
        sys.exit(0)
    sys.exit(worker.main())

"""The injection points of the contract (docs/worker-contract.md section 3).

Invariants:
- :data:`REQUIRED` is the first table of section 3 without its optional row:
  a worker must offer each, so one the conformance check passes and does
  not see reached is a gap;
- :data:`BOUNDARY` is the boundary table (experiment T crashes at each) and
  :data:`OPTIONAL` the points a worker may leave out; a worker without one
  leaves the experiments that need it unjudged, never failed;
- :data:`ALL` is every name a mapping may declare (section 14).
"""

from __future__ import annotations

REQUIRED = frozenset(
    {
        "after_lease_acquired",
        "after_lease_row_locked",
        "before_commit",
        "after_checkpoint_commit",
        "after_outbound_intent_commit",
        "after_dispatch_claim_commit",
        "after_tool_response_before_tx2_commit",
        "after_broker_ack_before_outbox_mark",
        "before_renew",
    }
)
BOUNDARY = frozenset(
    {
        "after_lease_acquired",
        "after_renew_commit",
        "after_checkpoint_commit",
        "after_outbound_intent_commit",
        "after_dispatch_claim_commit",
        "after_tool_response_before_tx2_commit",
        "after_dispatch_outcome_commit",
        "after_claims_expired_commit",
        "after_reconcile_query",
        "after_outbox_batch_locked",
        "after_broker_ack_before_outbox_mark",
        "after_outbox_mark_commit",
        "after_consumer_read",
        "after_consumer_dedup_commit",
    }
)
OPTIONAL = frozenset({"after_operator_lock", "after_reconcile_converge"} | (BOUNDARY - REQUIRED))
ALL = REQUIRED | BOUNDARY | OPTIONAL

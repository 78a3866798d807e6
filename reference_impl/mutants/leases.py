"""Rule 1 mutants: grant, renew, release and claim of the lease.

All of them are SQL overlays: the lease lives behind fencecheck.* functions
the worker role cannot bypass.
"""

from __future__ import annotations

from reference_impl.mutants.base import Mutant, SqlOverlay

MUTANTS = (
    Mutant(
        "lease_granted_in_seconds",
        1,
        ("A",),
        "a grant reads the lease duration as seconds instead of milliseconds: every lease "
        "lasts a thousand times longer than configured, so a frozen holder keeps its run "
        "long past the takeover the contract promises",
        SqlOverlay("lease_granted_in_seconds.sql", "fencecheck._grant"),
    ),
    Mutant(
        "renew_ignores_expiry",
        1,
        ("K",),
        "renew checks owner and epoch but not expiry: an expired lease nobody took over "
        "yet is revived by its old holder",
        SqlOverlay("renew_ignores_expiry.sql", "fencecheck.renew"),
    ),
    Mutant(
        "renew_ignores_owner",
        1,
        ("R",),
        "renew checks the epoch and the expiry but not the owner: a stale session "
        "passing the new epoch under its old owner renews the new holder's lease",
        SqlOverlay("renew_ignores_owner.sql", "fencecheck.renew"),
    ),
    Mutant(
        "release_ignores_epoch",
        1,
        ("R",),
        "release checks the owner but not the epoch: a session passing the new "
        "holder's owner with an old epoch gives the current lease up",
        SqlOverlay("release_ignores_epoch.sql", "fencecheck.release"),
    ),
    Mutant(
        "release_by_any_session",
        1,
        ("B", "R"),
        "release checks neither owner nor epoch: a stale holder resumed after a takeover "
        "gives the new holder's live lease up (global invariant "
        "lease.live_lease_moved_only_by_its_holder)",
        SqlOverlay("release_by_any_session.sql", "fencecheck.release"),
    ),
    Mutant(
        "takeover_keeps_epoch",
        1,
        ("B", "D"),
        "taking over an expired lease keeps its epoch (only a queued run's first grant "
        "counts + 1): the old and the new holder share one fencing token",
        SqlOverlay("takeover_keeps_epoch.sql", "fencecheck._grant"),
    ),
    Mutant(
        "release_resets_epoch",
        1,
        ("M",),
        "release puts the run back with epoch 0, so the next grant hands out an epoch "
        "that was used before (the audit trail shows the epoch going back)",
        SqlOverlay("release_resets_epoch.sql", "fencecheck.release"),
    ),
    Mutant(
        "claim_without_row_lock",
        1,
        ("Q", "D"),
        "claim reads its candidate without locking it (no FOR UPDATE) and grants it: "
        "two claimers that read the same run both grant it, the second over the "
        "first's live lease",
        SqlOverlay("claim_without_row_lock.sql", "fencecheck.claim"),
    ),
    Mutant(
        "claim_without_skip_locked",
        1,
        ("Q", "D"),
        "claim locks its candidate FOR UPDATE without SKIP LOCKED: it queues behind "
        "a session holding that run's row (a protected write in progress) instead "
        "of moving on",
        SqlOverlay("claim_without_skip_locked.sql", "fencecheck.claim"),
    ),
)

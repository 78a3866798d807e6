"""Rule 7 and 12 mutants: retries stay apart from old runs, tenants from each other."""

from __future__ import annotations

from reference_impl.mutants.base import Mutant, SqlOverlay

MUTANTS = (
    Mutant(
        "retry_reuses_run_id",
        7,
        ("G",),
        "a retry does not get a new run_id: the old run is queued again under its id, "
        "so anything addressed to the old execution reaches the retry",
        SqlOverlay("retry_reuses_run_id.sql", "fencecheck.retry_run"),
    ),
    Mutant(
        "retry_keeps_attempt_count",
        7,
        ("U",),
        "a retry is a new run that starts with the old run's attempt_count: a retry of a run "
        "whose attempt budget is spent starts with it spent",
        SqlOverlay("retry_keeps_attempt_count.sql", "fencecheck.retry_run"),
    ),
    Mutant(
        "callback_accepted_in_any_state",
        7,
        ("G",),
        "a tool callback converges its operation whatever the ledger says: a prepared "
        "operation never sent, or one whose result is recorded, takes the callback's resource",
        SqlOverlay("callback_accepted_in_any_state.sql", "fencecheck.deliver_callback"),
    ),
    Mutant(
        "callback_accepted_for_dead_run",
        7,
        ("G",),
        "a tool callback converges an operation in flight of a run that is terminal or no "
        "longer its task's active run: a late answer moves a cancelled or superseded run's ledger",
        SqlOverlay("callback_accepted_for_dead_run.sql", "fencecheck.deliver_callback"),
    ),
    Mutant(
        "rls_missing",
        12,
        ("N",),
        "row level security is off on the tenant tables: nothing scopes a query to the "
        "caller's tenant",
        SqlOverlay("rls_missing.sql", "RLS of the tenant tables"),
    ),
    Mutant(
        "worker_can_update_runs",
        12,
        ("N",),
        "the worker role may UPDATE agent_runs directly, around the protected-write "
        "functions (owner, epoch, revision, status)",
        SqlOverlay("worker_can_update_runs.sql", "the worker role's grants on agent_runs"),
    ),
    Mutant(
        "tenant_from_setting",
        12,
        ("N",),
        "the session's tenant comes from the setting app.tenant_id when one is set (contract "
        "v1), not only from the login role's binding: a session switches tenants with set_config",
        SqlOverlay("tenant_from_setting.sql", "fencecheck.session_tenant"),
    ),
    Mutant(
        "worker_can_write_bindings",
        12,
        ("N",),
        "the worker role may write public.tenant_bindings, so a worker session can bind its own "
        "login role to another tenant",
        SqlOverlay("worker_can_write_bindings.sql", "grants and policy of public.tenant_bindings"),
    ),
    Mutant(
        "worker_can_execute_control_plane",
        12,
        ("N",),
        "the worker role may execute the control plane's functions (create, retry, cancel, "
        "callbacks, operator decisions)",
        SqlOverlay(
            "worker_can_execute_control_plane.sql", "EXECUTE grants of the control-plane functions"
        ),
    ),
)

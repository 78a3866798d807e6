"""M: a checkpoint written by older (or unknown newer) code is migrated explicitly
or refused; it is never parsed into zero values.
"""

from __future__ import annotations

import hashlib
import json

from harness.checking import checkers
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from scenarios.common import finish, new_run, wait_claimable

SPEC = ExperimentSpec(
    id="M",
    title="checkpoint schema upgrade",
    seed_section="Chinese seed §6, §13.2 (Schema 升级)",
    invariant="a known old version is migrated explicitly (its values kept); an unknown "
    "version is refused with SchemaVersionUnknown and the run is not advanced",
    fault="the run's latest checkpoint is in an older schema version the worker names "
    "(op legacy_checkpoint) / in version 99, which no code knows",
    rules=(13,),
    variants=("old_version", "unknown_version"),
    lease_ttl_ms=500,
    natural_wait_s=0.5,
)


def _plant(ctx: ExperimentContext, run_id: str, version: int, state: dict[str, object]) -> int:
    """Write a checkpoint as other code would have, straight into the database.

    The new row is a copy of the run's latest checkpoint with the contract's
    columns replaced, so columns a worker adds of its own keep valid values.
    """
    row = checkers.run_row(ctx, run_id)
    revision = int(row["revision"]) + 1
    body = json.dumps(state, sort_keys=True, separators=(",", ":"))
    overrides = {
        "revision": revision,
        "schema_version": version,
        "state_json": state,
        "state_hash": "\\x" + hashlib.sha256(body.encode()).hexdigest(),
        "event_id": ctx.uuid(),
        "owner": "older-code",
    }
    ctx.sql(
        f"plant a schema_version {version} checkpoint",
        "WITH c AS (INSERT INTO agent_checkpoints SELECT (jsonb_populate_record(c, %s::jsonb)).* "
        "FROM agent_checkpoints c WHERE c.run_id = %s AND c.revision = %s RETURNING revision) "
        "UPDATE agent_runs SET revision = (SELECT revision FROM c), "
        "checkpoint_schema_version = %s WHERE run_id = %s RETURNING revision",
        [json.dumps(overrides), run_id, revision - 1, version, run_id],
    )
    return revision


def run(ctx: ExperimentContext) -> None:
    old = ctx.variant != "unknown_version"
    version = 99
    run_id = new_run(ctx)
    a = ctx.env.start_worker("A", "ops")
    lease = ctx.ok(a, "claim", run_id=run_id)
    ctx.ok(
        a,
        "save_checkpoint",
        run_id=run_id,
        epoch=lease["epoch"],
        expected_revision=lease["revision"],
        state={"step": "plan"},
    )
    keep: dict[str, object] = {}
    sample: dict[str, object] = {"cursor": 7, "step": "lookup", "total": 42}
    if old:
        # Only the worker knows its own older formats: it hands the harness one
        # sample old-version state and the values its migration must keep.
        legacy = ctx.ok(a, "legacy_checkpoint")
        version, sample, keep = legacy["schema_version"], legacy["state"], legacy["expect"]
    planted = _plant(ctx, run_id, version, sample)
    rows = checkers.checkpoints(ctx, run_id)
    ctx.fault(
        f"latest checkpoint is schema_version {version}",
        rows[-1]["schema_version"] == version and rows[-1]["revision"] == planted,
        expected=f"revision {planted} at schema_version {version}",
        observed=f"latest {(rows[-1]['revision'], rows[-1]['schema_version'])}",
    )
    read = ctx.op(a, "read_checkpoint", run_id=run_id)
    wait_claimable(ctx, run_id)
    b = ctx.env.start_worker("B", "run", ["--run-id", run_id, "--once"])
    code_b = finish(ctx, b)
    row = checkers.run_row(ctx, run_id)
    if old:
        state = read.result.get("state") or {}
        lost = {k: (v, _get(state, k)) for k, v in keep.items() if _get(state, k) != v}
        ctx.invariant(
            "old version migrated explicitly",
            read.ok and read.result.get("schema_version") != version and not lost,
            expected=f"read_checkpoint returns a newer schema keeping {keep}",
            observed=f"{read.result if read.ok else read.error}; values lost: {lost}",
        )
        ctx.invariant(
            "the run goes on from the migrated checkpoint",
            row["revision"] > planted and code_b == 0,
            expected=f"revision beyond {planted}, B exit 0",
            observed=f"revision {row['revision']}, B exit {code_b}",
        )
    else:
        ctx.invariant(
            "unknown version refused",
            not read.ok and read.error == "SchemaVersionUnknown",
            expected="SchemaVersionUnknown",
            observed=f"{read.result if read.ok else read.error}",
        )
        ctx.equal(
            "run not advanced past the unknown checkpoint",
            row["revision"],
            planted,
            what=f"agent_runs.revision (B exit {code_b})",
        )
        ctx.invariant(
            "worker refused to run it",
            code_b == 12,
            expected="B exits 12 (checkpoint schema refused)",
            observed=f"B exit {code_b}",
        )
    checkers.lease_history_is_sound(ctx, [run_id])


def _get(state: dict[str, object], path: str) -> object:
    """``a.b.c`` lookup in nested dicts; None when any part is missing."""
    value: object = state
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value

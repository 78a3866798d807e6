"""M: a checkpoint written by older (or unknown newer) code is migrated explicitly
or refused; it is never parsed into zero values.
"""

from __future__ import annotations

import hashlib
import json
import uuid

from harness import checkers
from harness.experiment import ExperimentContext, ExperimentSpec
from scenarios.common import finish, new_run, wait_claimable

SPEC = ExperimentSpec(
    id="M",
    title="checkpoint schema upgrade",
    seed_section="Chinese seed §6, §13.2 (Schema 升级)",
    invariant="a known old version is migrated explicitly (its values kept); an unknown "
    "version is refused with SchemaVersionUnknown and the run is not advanced",
    fault="the run's latest checkpoint has schema_version 1 (old) / 99 (unknown)",
    rules=(13,),
    variants=("old_version", "unknown_version"),
    lease_ttl_ms=500,
    natural_wait_s=0.5,
)


def _plant(ctx: ExperimentContext, run_id: str, version: int, state: dict[str, object]) -> int:
    """Write a checkpoint as other code would have, straight into the database."""
    row = checkers.run_row(ctx, run_id)
    revision = int(row["revision"]) + 1
    body = json.dumps(state, sort_keys=True, separators=(",", ":"))
    ctx.sql(
        f"plant a schema_version {version} checkpoint",
        "WITH c AS (INSERT INTO agent_checkpoints (run_id, tenant_id, revision, epoch, owner, "
        "state_json, state_hash, schema_version, event_id) VALUES (%s, %s, %s, %s, %s, "
        "%s::jsonb, %s, %s, %s) RETURNING revision) "
        "UPDATE agent_runs SET revision = (SELECT revision FROM c), "
        "checkpoint_schema_version = %s WHERE run_id = %s RETURNING revision",
        [
            run_id,
            row["tenant_id"],
            revision,
            row["epoch"],
            "older-code",
            body,
            hashlib.sha256(body.encode()).hexdigest(),
            version,
            str(uuid.uuid4()),
            version,
            run_id,
        ],
    )
    return revision


def run(ctx: ExperimentContext) -> None:
    old = ctx.variant != "unknown_version"
    version = 1 if old else 99
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
    planted = _plant(ctx, run_id, version, {"cursor": 7, "step": "lookup", "legacy_total": 42})
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
        ctx.invariant(
            "old version migrated explicitly",
            read.ok
            and read.result.get("schema_version") != version
            and state.get("cursor") == 7
            and state.get("legacy_total", state.get("total")) == 42,
            expected="read_checkpoint returns the current schema with the old values kept",
            observed=f"{read.result if read.ok else read.error}",
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

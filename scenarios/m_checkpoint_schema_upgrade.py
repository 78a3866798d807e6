"""M: a checkpoint written by older (or unknown newer) code is migrated explicitly
or refused; it is never parsed into zero values.

Variant ``malformed`` hands the worker checkpoints no code should have
written: the worker's own older-version sample with one field missing or of
another JSON type (a list where a string was, a string where a list was: a
string is iterable, the classic way to parse garbage into values), a state
that is no object, and a state that no longer matches its ``state_hash``, in
the current version and in the older one (the sample with one value changed
after it was hashed: still a valid older state, so only the hash tells; a
worker that checks the hash of its current version only would migrate it).
Each must be refused by name, and a worker resuming the run from either
tampered one must neither advance it nor call a tool.

Variant ``plan_done``: the older sample the worker gives when asked for one
whose every step is done (``legacy_checkpoint`` with ``plan_done``: the old
code died between its last step and the run's terminal status). Migrated,
the plan is done and the run still live: a resuming worker ends it with its
terminal write alone, no step redone, nothing sent to the tool (blind hunt
61 #07: a Go resume check that refused a cursor at the end of its plan left
such a run to fail at every attempt).

Variant ``out_of_range`` hands a resuming worker its own current-version
state (from a run it stopped after its first checkpoint) with an integer of
it set far past any count a workflow keeps, its hash made again: no code of
the version wrote it, yet every field has its type. Whether the worker
refuses it is its own rule; what the contract forbids is a run that then
succeeds without going through its steps (a cursor read past the plan).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from harness.checking import checkers
from harness.contract import needs
from harness.engine.environment import MigrateFailed
from harness.engine.experiment import ExperimentContext, ExperimentSpec, Inconclusive
from harness.parts.control import Crash
from harness.parts.postgres import PostgresCluster
from harness.parts.processes import WorkerProcess
from harness.waiting import wait_for
from scenarios.common import finish, new_run, wait_claimable, writes_name_workflow_steps

PLAN_DONE = "plan_done"

SPEC = ExperimentSpec(
    id="M",
    title="checkpoint schema upgrade",
    seed_section="Chinese seed §6, §13.2 (Schema 升级)",
    invariant="a known old version is migrated explicitly (its values kept); an unknown "
    "version, a malformed state or one that does not match its hash (in any version) is "
    "refused by name (SchemaVersionUnknown, CheckpointCorrupt) and the run is not advanced",
    fault="the run's latest checkpoint is in an older schema version the worker names "
    "(op legacy_checkpoint) / in version 99, which no code knows / that older sample with a "
    "field missing or retyped, no object, or a value changed after it was hashed / a current "
    "state changed after it was hashed / the worker's own current state with an integer set "
    "out of range and hashed again",
    needs=(
        *needs.capabilities("workflow", "checkpoints", "contract_schema"),
        needs.point("after_checkpoint_commit", "out_of_range"),
    ),
    rules=(13,),
    variants=(
        "old_version",
        "unknown_version",
        "malformed",
        "out_of_range",
        "concurrent_migrate",
        PLAN_DONE,
    ),
    lease_ttl_ms=500,
    natural_wait_s=0.5,
)
#: The lease of the worker that resumes the run from the migrated checkpoint.
RESUMING_LEASE_TTL_MS = 5000
#: out_of_range: the value planted in place of an integer of the worker's own
#: state, and how many of its integers (depth first) get it, one run each.
OUT_OF_RANGE = 1_000_000
OUT_OF_RANGE_LEAVES = 2
#: out_of_range: what the first list of the worker's own state becomes (a
#: value of another type, every other field as the worker wrote it).
RETYPED_LIST = "plan"


def _plant(
    ctx: ExperimentContext, run_id: str, version: int, state: object, hashed: object = None
) -> int:
    """Write a checkpoint as other code would have, straight into the database.

    The new row is a copy of the run's latest checkpoint with the contract's
    columns replaced, so columns a worker adds of its own keep valid values;
    columns the database fills itself (identity, or any default such as a
    surrogate key's sequence) are left to it rather than copied, so a
    worker's own surrogate key cannot collide. Its ``state_hash`` is that of
    ``hashed`` when given (a state changed after hashing), else of ``state``.
    """
    row = checkers.run_row(ctx, run_id)
    revision = int(row["revision"]) + 1
    # The contract's canonical JSON: a character outside ASCII as itself (the
    # run's order_id has one), never \u-escaped.
    body = json.dumps(
        state if hashed is None else hashed,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    overrides = {
        "revision": revision,
        "schema_version": version,
        "state_json": state,
        "state_hash": "\\x" + hashlib.sha256(body.encode("utf-8")).hexdigest(),
        "event_id": ctx.uuid(),
        "owner": "older-code",
    }
    # The plant goes through the model's checkpoints (a same-named table of the
    # contract's schema, needs contract_schema) and copies every column of it.
    schema, table = checkpoints_table(ctx).split(".", 1)
    columns = [
        r["column_name"]
        for r in ctx.sql(
            "checkpoint columns the planted row copies",
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = %s AND is_generated = 'NEVER' "
            "AND (column_name = ANY(%s) OR (column_default IS NULL AND is_identity = 'NO')) "
            "ORDER BY ordinal_position",
            [schema, table, CONTRACT_COLUMNS],
        )
    ]
    listed = ", ".join(f'"{c}"' for c in columns)
    selected = ", ".join(f'p."{c}"' for c in columns)
    ctx.sql(
        f"plant a schema_version {version} checkpoint",
        f"WITH c AS (INSERT INTO fencecheck_model.agent_checkpoints ({listed}) "
        f"SELECT {selected} "
        "FROM fencecheck_model.agent_checkpoints c, jsonb_populate_record(c, %s::jsonb) p "
        "WHERE c.run_id = %s AND c.revision = %s RETURNING revision) "
        "UPDATE fencecheck_model.agent_runs SET revision = (SELECT revision FROM c), "
        "checkpoint_schema_version = %s WHERE run_id = %s RETURNING revision",
        [json.dumps(overrides), run_id, revision - 1, version, run_id],
    )
    return revision


def checkpoints_table(ctx: ExperimentContext) -> str:
    """The system's table behind the model's checkpoints."""
    relation = ctx.system.model.relations["agent_checkpoints"]
    if relation is None:
        raise Inconclusive("the system has no checkpoints to plant one in")
    return relation.table


# The checkpoint columns of the contract (§6): always copied (or replaced).
CONTRACT_COLUMNS = [
    "run_id",
    "revision",
    "epoch",
    "owner",
    "state_json",
    "state_hash",
    "schema_version",
    "event_id",
]


def run(ctx: ExperimentContext) -> None:
    if ctx.variant == "concurrent_migrate":
        run_concurrent_migrate(ctx)
        return
    if ctx.variant == "malformed":
        run_malformed(ctx)
        return
    if ctx.variant == "out_of_range":
        run_out_of_range(ctx)
        return
    old = ctx.variant != "unknown_version"
    version = 99
    run_id = new_run(ctx)
    a = ctx.env.start_worker("A", "ops")
    lease = ctx.ok(a, "claim", run_id=run_id)
    written = ctx.ok(
        a,
        "save_checkpoint",
        run_id=run_id,
        epoch=lease["epoch"],
        expected_revision=lease["revision"],
        state={"step": "plan"},
    )
    if not old:
        _declared_version_kept(ctx, a, run_id, lease["epoch"], int(written["revision"]))
    keep: dict[str, object] = {}
    sample: dict[str, object] = {"cursor": 7, "step": "lookup", "total": 42}
    if old:
        # Only the worker knows its own older formats: it hands the harness one
        # sample old-version state and the values its migration must keep.
        asked: dict[str, Any] = {"plan_done": True} if ctx.variant == PLAN_DONE else {}
        legacy = ctx.ok(a, "legacy_checkpoint", **asked)
        version, sample, keep = legacy["schema_version"], legacy["state"], legacy["expect"]
        if asked:
            ctx.fault(
                "the worker's older sample has every step of its plan done",
                legacy.get("plan_done") is True,
                expected="legacy_checkpoint with plan_done answers plan_done true (a sample "
                "whose every step is done)",
                observed=f"plan_done {legacy.get('plan_done')!r}; sample {sample}",
            )
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
    # B's lease is long: M tests what B reads, not timing, and under load a
    # 500 ms lease ran out while B's renewal waited on its own slow write
    # (refused, as it must be: B cancelled itself and the run stayed unfinished).
    b = ctx.env.start_worker(
        "B",
        "run",
        ["--run-id", run_id, "--once"],
        env={"FENCECHECK_LEASE_TTL_MS": str(RESUMING_LEASE_TTL_MS)},
    )
    code_b = finish(ctx, b)
    row = checkers.run_row(ctx, run_id)
    after = [c for c in checkers.checkpoints(ctx, run_id) if c["revision"] > planted]
    told = f"read_checkpoint: {read.result if read.ok else read.error}; B exit {code_b}"
    if old:
        # Judged on what B wrote after resuming (contract §7: its first write after a
        # migrated checkpoint keeps every value legacy_checkpoint's `expect` names).
        first = after[0] if after else None
        state = (first or {}).get("state_json") or {}
        lost = {k: (v, _get(state, k)) for k, v in keep.items() if _get(state, k) != v}
        ctx.invariant(
            "old version migrated explicitly",
            first is None or (first["schema_version"] != version and not lost),
            expected=f"B's first checkpoint after revision {planted} (if any) is in a newer "
            f"schema and keeps {keep}",
            observed=f"first checkpoint after: "
            f"{(first['revision'], first['schema_version']) if first else None}; values lost: "
            f"{lost}; {told}",
        )
        ctx.progress(
            "the run goes on from the migrated checkpoint",
            row["revision"] > planted and row["status"] == "succeeded",
            expected=f"revision beyond {planted}, run succeeded",
            observed=f"revision {row['revision']}, status {row['status']}; {told}",
        )
        # read_checkpoint writes nothing: its answer is the only place the worker's
        # parse of the old state shows, so this one check rests on its reply.
        rstate = read.result.get("state") or {}
        rlost = {k: (v, _get(rstate, k)) for k, v in keep.items() if _get(rstate, k) != v}
        # The revision it names (optional) is the checkpoint's, migrated or not.
        named = read.result.get("revision") if read.ok else None
        ctx.invariant(
            "read_checkpoint migrates the old version",
            read.ok
            and read.result.get("schema_version") != version
            and not rlost
            and named in (None, planted),
            expected=f"read_checkpoint answers a newer schema keeping {keep}, naming "
            f"revision {planted} if it names one",
            observed=f"{read.result if read.ok else read.error}; values lost: {rlost}",
        )
    else:
        # As above: the reply is the only witness of read_checkpoint's parse.
        ctx.invariant(
            "unknown version refused",
            not read.ok and read.error == "SchemaVersionUnknown",
            expected="SchemaVersionUnknown",
            observed=f"{read.result if read.ok else read.error}",
        )
        ctx.equal(
            "run not advanced past the unknown checkpoint",
            (row["revision"], [c["revision"] for c in after]),
            (planted, []),
            what=f"(agent_runs.revision, checkpoints after it) ({told})",
        )
        sent = checkers.tool_requests(ctx, run_id=run_id)
        ctx.equal(
            "nothing done from the unknown checkpoint",
            len(sent),
            0,
            what=f"tool requests for the run ({told})",
        )
    if ctx.variant == PLAN_DONE:
        sent = checkers.tool_requests(ctx, run_id=run_id)
        ctx.invariant(
            "nothing redone from a plan with every step done",
            not sent and len(after) <= 1,
            expected=f"no tool request for the run and at most one write after revision "
            f"{planted} (the terminal one)",
            observed=f"tool requests {len(sent)}; writes after it "
            f"{[(c['revision'], c['schema_version']) for c in after]}; {told}",
        )
    _migrate_again_keeps_everything(ctx, run_id)
    checkers.lease_history_is_sound(ctx, [run_id])


def _migrate_again_keeps_everything(ctx: ExperimentContext, run_id: str) -> None:
    """The worker's migrate, run again against the experiment's migrated
    database once the run is done (contract: migrate is idempotent; a
    deployment runs it at every upgrade), must exit 0 and leave the run and
    its checkpoints as they were."""
    before = (checkers.run_row(ctx, run_id), len(checkers.checkpoints(ctx, run_id)))
    try:
        ctx.env.migrate_again()
        outcome = "exit 0"
    except MigrateFailed as exc:
        outcome = f"failed: {str(exc)[:300]}"
    ctx.command(f"the worker's migrate run again against the migrated database: {outcome}")
    row, count = checkers.run_row(ctx, run_id), len(checkers.checkpoints(ctx, run_id))
    ctx.invariant(
        "a second migrate of the migrated database succeeds and changes no run",
        outcome == "exit 0"
        and (row["revision"], row["status"], count)
        == (before[0]["revision"], before[0]["status"], before[1]),
        expected="migrate exits 0; the run's revision, status and checkpoints as before",
        observed=f"migrate {outcome}; run {(row['revision'], row['status'])} with {count} "
        f"checkpoint(s), before {(before[0]['revision'], before[0]['status'])} with {before[1]}",
    )


#: The contract's group roles: cluster-wide, made by whichever migrate is first.
GROUP_ROLES = ("fencecheck_worker", "fencecheck_operator")
CONCURRENT_MIGRATES = 2
#: The contract role the harness holds uncommitted while the migrates start,
#: and how long it waits for both to block behind it.
HELD_ROLE = "fencecheck_worker"
BLOCK_TIMEOUT_S = 20.0


def run_concurrent_migrate(ctx: ExperimentContext) -> None:
    """A first deployment: the worker's ``migrate`` started twice at once, each
    against its own new database of one cluster fresh from initdb (contract:
    migrate may run concurrently against different databases of one cluster).
    The group roles are the cluster's, not a database's: both migrates find
    them missing, one makes them, and the other must take them instead of
    failing, whatever error its lost race gives. Left to chance the race is
    a window of microseconds; the harness makes it certain: it creates
    ``fencecheck_worker`` itself in a transaction it keeps open, so each
    migrate that finds the role missing blocks on that uncommitted row; once
    both wait, it rolls back: one migrate's role goes in, and the other's
    CREATE ROLE, which waited on it, fails on the catalog's unique index
    (23505, not duplicate_object). Both must exit 0 and leave a whole schema."""
    with ctx.env.fresh_cluster("first_deployment") as cluster:
        roles_before = cluster.query(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", [list(GROUP_ROLES)]
        )
        databases = [cluster.create_database(prefix="deploy") for _ in range(CONCURRENT_MIGRATES)]
        spans: list[tuple[float, float, str]] = [(0.0, 0.0, "not started")] * len(databases)
        start = threading.Barrier(len(databases))

        def migrate(i: int) -> None:
            start.wait(timeout=30)
            began = time.monotonic()
            try:
                ctx.env.migrate_into(databases[i].admin_dsn, f"migrate-concurrent-{i + 1}.log")
                outcome = "exit 0"
            except MigrateFailed as exc:
                outcome = f"failed: {str(exc)[:400]}"
            spans[i] = (began, time.monotonic(), outcome)

        threads = [threading.Thread(target=migrate, args=(i,)) for i in range(len(databases))]
        with psycopg.connect(cluster.admin_dsn(), autocommit=False) as hold:
            holder = int(hold.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
            hold.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(HELD_ROLE)))
            for thread in threads:
                thread.start()
            direct, blocked = _blocked_behind(ctx, cluster, holder, len(databases), threads)
            hold.rollback()
        for thread in threads:
            thread.join()
        for i, (began, ended, outcome) in enumerate(spans):
            ctx.command(
                f"migrate {i + 1} of {len(spans)} into {databases[i].name} of a fresh cluster: "
                f"{outcome} ({ended - began:.2f} s)"
            )
        ctx.fault(
            f"both migrates waited while the harness held the creation of {HELD_ROLE}",
            not roles_before and direct >= 1 and blocked >= len(databases),
            expected=f"none of {list(GROUP_ROLES)} before; {len(databases)} migrate backends "
            f"blocked, at least one behind the harness's uncommitted CREATE ROLE {HELD_ROLE} "
            "(the other may wait behind the first's uncommitted roles), before it rolled back",
            observed=f"roles before {[r['rolname'] for r in roles_before]}; {blocked} blocked, "
            f"{direct} of them behind the harness",
        )
        outcomes = [o for _, _, o in spans]
        schemas = [
            db.query(
                "SELECT to_regclass('public.agent_runs') IS NOT NULL AS runs, "
                "to_regclass('public.tenant_bindings') IS NOT NULL AS bindings"
            )[0]
            for db in databases
        ]
        roles_after = cluster.query(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", [list(GROUP_ROLES)]
        )
        ctx.invariant(
            "concurrent migrates of a first deployment both succeed",
            all(o == "exit 0" for o in outcomes)
            and all(s["runs"] and s["bindings"] for s in schemas)
            and len(roles_after) == len(GROUP_ROLES),
            expected="both exit 0; each database has agent_runs and tenant_bindings; the "
            "cluster has both group roles",
            observed=f"migrates {outcomes}; schemas {schemas}; roles "
            f"{sorted(r['rolname'] for r in roles_after)}",
        )


def _blocked_behind(
    ctx: ExperimentContext,
    cluster: PostgresCluster,
    holder: int,
    wanted: int,
    threads: list[threading.Thread],
) -> tuple[int, int]:
    """(backends blocked behind ``holder``, backends blocked at all) once
    ``wanted`` are blocked, at least one of them behind the harness (the
    other may wait behind the first: a migrate that creates two roles in one
    transaction holds its first one uncommitted while it waits for the
    second), or once every migrate ended without: bounded, and the counts are
    the fault's evidence."""
    query = (
        "SELECT count(*) FILTER (WHERE %s = ANY(pg_blocking_pids(pid))) AS direct, "
        "count(*) FILTER (WHERE cardinality(pg_blocking_pids(pid)) > 0) AS blocked "
        "FROM pg_stat_activity"
    )

    def counts() -> tuple[int, int]:
        row = cluster.query(query, [holder])[0]
        return int(row["direct"]), int(row["blocked"])

    def ready() -> bool:
        direct, blocked = counts()
        return (direct >= 1 and blocked >= wanted) or not any(t.is_alive() for t in threads)

    try:
        wait_for(
            ready,
            what=f"{wanted} migrates blocked, one behind the harness's CREATE ROLE {HELD_ROLE}",
            timeout_s=BLOCK_TIMEOUT_S,
        )
    except TimeoutError as exc:
        ctx.command(f"not every migrate blocked: {exc}")
    return counts()


def _declared_version_kept(
    ctx: ExperimentContext, a: WorkerProcess, run_id: str, epoch: int, revision: int
) -> None:
    """A checkpoint declared in schema_version 0 (below the contract's minimum
    of 1: a version no code writes) is refused, or stored as declared; never
    under another version. A worker that takes a falsy version for "none
    given" and stores its current one would later parse, as its own format,
    a state nobody checked against it."""
    before = {c["revision"] for c in checkers.checkpoints(ctx, run_id)}
    reply = ctx.op(
        a,
        "save_checkpoint",
        run_id=run_id,
        epoch=epoch,
        expected_revision=revision,
        state={"step": "plan", "declared_version": 0},
        schema_version=0,
    )
    new = [c for c in checkers.checkpoints(ctx, run_id) if c["revision"] not in before]
    ctx.invariant(
        "a checkpoint is stored in the schema version it declares, or refused",
        all(c["schema_version"] == 0 for c in new),
        expected="save_checkpoint declaring schema_version 0: refused, or stored with "
        "schema_version 0",
        observed=f"reply {'ok' if reply.ok else reply.error}; new checkpoints (revision, "
        f"schema_version) {[(c['revision'], c['schema_version']) for c in new]}",
    )


#: A value of another JSON type for each type a sample field may hold: a list
#: becomes a string (iterable: list("plan") parses into letters), a string a
#: list, an object a list, a number a string, a boolean a string.
def _retyped(value: object) -> object | None:
    if isinstance(value, bool):
        return "true"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return "".join(str(v) for v in value) or "x"
    if isinstance(value, dict):
        return [value]
    return None  # null: no type to change


def _malformed(sample: dict[str, object]) -> list[tuple[str, object]]:
    """The sample with each top-level field missing, then retyped, then not an object."""
    cases: list[tuple[str, object]] = []
    for key in sorted(sample):
        cases.append((f"without {key!r}", {k: v for k, v in sample.items() if k != key}))
    for key in sorted(sample):
        other = _retyped(sample[key])
        if other is not None:
            cases.append((f"{key!r} as {type(other).__name__}", {**sample, key: other}))
    cases.append(("a list, not an object", [sample]))
    return cases


def run_malformed(ctx: ExperimentContext) -> None:
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
    own = checkers.checkpoints(ctx, run_id)[-1]  # written by A: its current version
    legacy = ctx.ok(a, "legacy_checkpoint")
    version, sample = legacy["schema_version"], legacy["state"]
    if not isinstance(sample, dict) or not sample:
        raise Inconclusive(f"legacy_checkpoint's sample is no object with fields: {sample!r}")
    cases: list[tuple[str, int, object, object, str]] = [
        (what, version, state, None, "SchemaVersionUnknown") for what, state in _malformed(sample)
    ]
    # The older sample as it is, under a version no code wrote, below every
    # known one: a decoder that refuses only versions newer than its own would
    # take it for the older version (blind hunt 34 #09).
    cases.append(
        (f"the v{version} sample under version 0", 0, sample, None, "SchemaVersionUnknown")
    )
    changed, legacy_tampered = _tampered(sample)
    cases.append(
        (
            f"v{version} sample with {changed} after hashing",
            version,
            legacy_tampered,
            sample,
            "CheckpointCorrupt",
        )
    )
    mine = own["state_json"] if isinstance(own["state_json"], dict) else {}
    tampered = {**mine, "tampered": True}
    cases.append(
        (
            f"v{own['schema_version']} changed after hashing",
            own["schema_version"],
            tampered,
            own["state_json"],
            "CheckpointCorrupt",
        )
    )
    landed: list[str] = []
    for what, v, state, hashed, error in cases:
        planted = _plant(ctx, run_id, v, state, hashed)
        latest = checkers.checkpoints(ctx, run_id)[-1]
        if (latest["revision"], latest["schema_version"]) == (planted, v):
            landed.append(what)
        read = ctx.op(a, "read_checkpoint", run_id=run_id)
        ctx.invariant(
            f"checkpoint {what} refused",
            not read.ok and read.error == error,
            expected=f"read_checkpoint answers {error} (v{v} state: {json.dumps(state)[:120]})",
            observed=f"{read.result if read.ok else read.error}",
        )
    ctx.fault(
        "every malformed checkpoint was the run's latest when it was read",
        len(landed) == len(cases),
        expected=f"{len(cases)} plants, each the latest checkpoint",
        observed=f"{len(landed)} landed: {landed}",
    )
    # A worker resuming from each tampered checkpoint in turn, planted again
    # as the latest: the older version's (B), then the current one's (C).
    tampered_cases = [c for c in cases if c[4] == "CheckpointCorrupt"]
    for name, (what, v, state, hashed, _) in zip("BC", tampered_cases, strict=True):
        _resume_refused(ctx, run_id, name, f"checkpoint {what}", v, state, hashed)
    checkers.lease_history_is_sound(ctx, [run_id])


def _stopped_after_first_checkpoint(
    ctx: ExperimentContext, worker: str
) -> tuple[str, dict[str, Any]]:
    """A new run whose `run` worker was killed right after its first
    checkpoint committed; the run and that checkpoint (the worker's own
    current-version state)."""
    run_id = new_run(ctx)
    ctx.arm(worker, "after_checkpoint_commit", Crash(), times=1)
    code = finish(ctx, ctx.env.start_worker(worker, "run", ["--run-id", run_id, "--once"]))
    rows = checkers.checkpoints(ctx, run_id)
    ctx.fault(
        f"{worker} died after its first checkpoint",
        code == -9 and bool(rows),
        expected=f"{worker} killed by SIGKILL at after_checkpoint_commit, a checkpoint written",
        observed=f"{worker} exit {code}; {len(rows)} checkpoint(s)",
    )
    if not rows:
        raise Inconclusive(f"{worker} wrote no checkpoint to take a state from")
    return run_id, rows[-1]


def _int_leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of the integer leaves (never a boolean), depth first, keys in order."""
    if isinstance(value, dict):
        return [p for k in sorted(value) for p in _int_leaves(value[k], (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _int_leaves(v, (*path, i))]
    return [path] if isinstance(value, int) and not isinstance(value, bool) and path else []


def _with_leaf(state: Any, path: tuple[Any, ...], value: object) -> Any:
    """A copy of ``state`` with the leaf at ``path`` replaced (None: no such leaf)."""
    copy = json.loads(json.dumps(state))
    holder = copy
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = value
    return copy


def _list_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of the lists in ``value`` (outermost first, keys in order)."""
    found = [path] if isinstance(value, list) and path else []
    if isinstance(value, dict):
        found += [p for k in sorted(value) for p in _list_paths(value[k], (*path, k))]
    elif isinstance(value, list):
        found += [p for i, v in enumerate(value) for p in _list_paths(v, (*path, i))]
    return found


def run_out_of_range(ctx: ExperimentContext) -> None:
    run_id, own = _stopped_after_first_checkpoint(ctx, "A")
    leaves = _int_leaves(own["state_json"])[:OUT_OF_RANGE_LEAVES]
    if not leaves:
        raise Inconclusive("the worker's own state holds no integer to set out of range")
    # And its first list turned into a string (generated 38a26c91: a v2 check
    # that no longer required the plan to be a list resumed a plan of letters).
    plants: list[tuple[tuple[Any, ...], object]] = [(p, OUT_OF_RANGE) for p in leaves]
    plants += [(p, RETYPED_LIST) for p in _list_paths(own["state_json"])[:1]]
    runs: list[str] = []
    for i, (path, value) in enumerate(plants):
        if i > 0:
            run_id, own = _stopped_after_first_checkpoint(ctx, f"A{i}")
        field = ".".join(str(p) for p in path)
        try:
            state = _with_leaf(own["state_json"], path, value)
        except (KeyError, IndexError, TypeError):
            ctx.command(f"run {run_id[:8]}: its state has no {field}; not planted")
            continue
        planted = _plant(ctx, run_id, int(own["schema_version"]), state)
        wait_claimable(ctx, run_id)
        epoch_before = checkers.run_row(ctx, run_id, "the run before B resumes it")["epoch"]
        code = finish(ctx, ctx.env.start_worker(f"B{i}", "run", ["--run-id", run_id, "--once"]))
        row = checkers.run_row(ctx, run_id)
        _exit_zero_is_true(ctx, f"B{i}", code, row, epoch_before)
        ctx.command(
            f"run {run_id[:8]}: v{own['schema_version']} state with {field} = {value!r} "
            f"planted at revision {planted}; B{i} exit {code}, run {row['status']} at revision "
            f"{row['revision']}"
        )
        runs.append(run_id)
    ctx.fault(
        "a state with a value out of range or of another type was the run's latest when a "
        "worker resumed it",
        bool(runs),
        expected=f"{len(plants)} plant(s): {[('.'.join(map(str, p)), v) for p, v in plants]}",
        observed=f"{len(runs)} planted",
    )
    # Refused or resumed, never a run that succeeded without its steps.
    writes_name_workflow_steps(ctx, runs)
    checkers.lease_history_is_sound(ctx, runs)


def _exit_zero_is_true(
    ctx: ExperimentContext, worker: str, code: int | None, row: dict[str, Any], epoch_before: int
) -> None:
    """A `run --once` worker's exit 0 says the run is done or paused for a
    person, or that it never took it (contract section 2, exit codes): one
    that took the run over and left it running under its own lease lied
    (blind hunt 41 #09 and generated dd732219: a state past its plan found
    no step left, and the worker exited 0 with the run still running)."""
    took = row["epoch"] > epoch_before
    ctx.invariant(
        f"{worker}'s exit 0 is true of the run",
        code != 0 or not took or row["status"] in ("succeeded", "paused_human"),
        expected="exit 0 only with the run succeeded or paused for a person, or never taken; a "
        "refused state exits 12 (SchemaVersionUnknown)",
        observed=f"{worker} exit {code}; run {row['status']} at epoch {row['epoch']} (was "
        f"{epoch_before}), owner {row['owner']}",
    )


def _resume_refused(
    ctx: ExperimentContext,
    run_id: str,
    worker: str,
    what: str,
    version: int,
    state: object,
    hashed: object,
) -> None:
    """Plant a tampered checkpoint as the run's latest, let a `run` worker take
    the run: from the database, it wrote nothing after it, and the tool got no
    request for the run while it ran (one sent earlier is an earlier worker's)."""
    planted = _plant(ctx, run_id, version, state, hashed)
    sent_before = len(checkers.tool_requests(ctx, run_id=run_id))
    wait_claimable(ctx, run_id)
    w = ctx.env.start_worker(worker, "run", ["--run-id", run_id, "--once"])
    code = finish(ctx, w)
    row = checkers.run_row(ctx, run_id)
    after = [c for c in checkers.checkpoints(ctx, run_id) if c["revision"] > planted]
    ctx.equal(
        f"run not advanced past the {what}",
        (row["revision"], [c["revision"] for c in after]),
        (planted, []),
        what=f"(agent_runs.revision, checkpoints after it) ({worker} exit {code})",
    )
    ctx.equal(
        f"nothing done from the {what}",
        len(checkers.tool_requests(ctx, run_id=run_id)[sent_before:]),
        0,
        what=f"tool requests for the run while {worker} ran ({worker} exit {code})",
    )


def _tampered(sample: dict[str, object]) -> tuple[str, dict[str, object]]:
    """The sample with one value changed and its JSON type kept, so it is still
    a valid state of its version and only its hash tells: the first number
    (depth first, keys in order) raised by one, else the first string with a
    suffix; a sample with neither gains a field. Returns what was changed too."""
    tampered = json.loads(json.dumps(sample))
    for kinds in ((int, float), (str,)):
        path = _first_leaf(tampered, kinds)
        if path is None:
            continue
        *parents, last = path
        holder = tampered
        for part in parents:
            holder = holder[part]
        was = holder[last]
        holder[last] = f"{was}-tampered" if isinstance(was, str) else was + 1
        return ".".join(str(p) for p in path) + " changed", tampered
    return "a field added", {**tampered, "tampered": True}


def _first_leaf(
    value: Any, kinds: tuple[type, ...], path: tuple[Any, ...] = ()
) -> tuple[Any, ...] | None:
    """The path of the first leaf of one of ``kinds`` (never a boolean)."""
    if isinstance(value, dict):
        children: list[tuple[Any, Any]] = [(k, value[k]) for k in sorted(value)]
    elif isinstance(value, list):
        children = list(enumerate(value))
    else:
        found = isinstance(value, kinds) and not isinstance(value, bool)
        return path if found and path else None
    for key, child in children:
        hit = _first_leaf(child, kinds, (*path, key))
        if hit is not None:
            return hit
    return None


def _get(state: dict[str, object], path: str) -> object:
    """``a.b.c`` lookup in nested dicts; None when any part is missing."""
    value: object = state
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value

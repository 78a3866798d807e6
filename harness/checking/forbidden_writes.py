"""Writes the protocol forbids, sent as raw SQL by a session of a role.

Worker contract section 7 ("What a role's session cannot write"): a session
of the worker role (and of the operator role) must not be able to make a
write the protocol forbids, whatever SQL it sends. The contract does not say
how a worker keeps that: the reference implementation gives the worker role
no table write at all (only functions that check the fence), the Go worker
gives it column rights held to the protocol by guard triggers. So the
probes here are plain statements on the contract tables, each sent in its
own transaction and COMMITTED (a check deferred to COMMIT must get its
chance), and a probe is judged by what the harness's own audit trail
recorded for the probe's session, never by the error text: a write is made
when the audit trigger saw a committed change from that session.

Every probe aims at rows of the prober's own tenant (cross-tenant probes are
N's table probes), and at one of three runs set up by N: one whose lease is
live (held by another session), one whose lease has expired (nobody took
over), one queued.
"""

from __future__ import annotations

import dataclasses
import uuid
from contextlib import closing
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from harness.checking import checkers
from harness.engine.experiment import ExperimentContext

#: Contract tables whose forbidden writes the probes below cover: a role may
#: hold write rights on these only if every probe is refused.
GUARDED = frozenset(
    {"public.agent_runs", "public.agent_checkpoints", "public.outbox", "public.tool_operations"}
)

#: Prefix of the probes' application_name (how their changes are found in
#: the audit trail).
APP_PREFIX = "fcprobe-"

INTRUDER = "fencecheck-probe-intruder"


@dataclasses.dataclass(frozen=True)
class Lease:
    """A run of the prober's tenant as the harness read it before the probes."""

    run_id: str
    owner: str | None
    epoch: int
    revision: int


@dataclasses.dataclass(frozen=True)
class Fixture:
    live: Lease  # held by another session, renewed by its heartbeat
    expired: Lease  # its holder's lease ran out, nobody took over
    queued: str  # a run never claimed


@dataclasses.dataclass(frozen=True)
class Probe:
    name: str
    statements: tuple[tuple[sql.Composed | sql.SQL, list[Any]], ...]
    control_plane: bool = False  # a move the operator role may make (not probed as operator)
    target: str = "live"  # which fixture run it aims at: live, expired or queued


@dataclasses.dataclass(frozen=True)
class Attempt:
    probe: str
    role: str
    outcome: str  # "committed" or "refused (<sqlstate>): <first line>"
    changes: int  # audited changes of the contract tables made by the probe's session
    aimed: bool  # its target run was in the intended state when it was sent


def _insertable_columns(ctx: ExperimentContext, table: str) -> list[str]:
    """Columns a copied row can carry: not identity, not generated, no sequence default."""
    rows = ctx.sql(
        f"insertable columns of {table} (catalog)",
        "SELECT a.attname AS name FROM pg_attribute a"
        " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped"
        " AND a.attidentity = '' AND a.attgenerated = ''"
        " AND coalesce(pg_get_expr(d.adbin, d.adrelid), '') NOT LIKE 'nextval(%%'"
        " ORDER BY a.attnum",
        [table],
    )
    return [str(r["name"]) for r in rows]


def _template(ctx: ExperimentContext, table: str, where: str, params: list[Any]) -> dict[str, Any]:
    """One existing row of ``table`` as JSON (read as superuser), to copy from."""
    rows = ctx.sql(
        f"template row of {table} for the probes",
        f"SELECT to_jsonb(t) AS row FROM {table} t WHERE {where} LIMIT 1",
        params,
    )
    if not rows:
        raise ValueError(f"no row of {table} where {where} to copy a probe from")
    row: dict[str, Any] = rows[0]["row"]
    return row


def _insert(
    table: str, columns: list[str], row: dict[str, Any]
) -> tuple[sql.Composed | sql.SQL, list[Any]]:
    """INSERT of ``row`` (a JSON object) into ``table``, through the table's own row type."""
    schema, name = table.split(".")
    ident = sql.Identifier(schema, name)
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns if c in row)
    stmt = sql.SQL(
        "INSERT INTO {t} ({c}) SELECT {c} FROM jsonb_populate_record(NULL::{t}, %s::jsonb)"
    )
    return stmt.format(t=ident, c=cols), [Jsonb(row)]


def _stmt(text: str, *params: Any) -> tuple[sql.Composed | sql.SQL, list[Any]]:
    return sql.SQL(text), list(params)


def probes(ctx: ExperimentContext, fx: Fixture) -> list[Probe]:
    """The forbidden writes, built from rows of the fixture's runs."""
    live, exp = fx.live, fx.expired
    cp_cols = _insertable_columns(ctx, "public.agent_checkpoints")
    ob_cols = _insertable_columns(ctx, "public.outbox")
    op_cols = _insertable_columns(ctx, "public.tool_operations")
    run_cols = _insertable_columns(ctx, "public.agent_runs")
    cp = _template(
        ctx, "public.agent_checkpoints", "run_id = %s ORDER BY revision DESC", [live.run_id]
    )
    ob = _template(ctx, "public.outbox", "run_id = %s", [live.run_id])
    op = _template(ctx, "public.tool_operations", "run_id = %s", [live.run_id])
    cp_exp = _template(
        ctx, "public.agent_checkpoints", "run_id = %s ORDER BY revision DESC", [exp.run_id]
    )
    ob_exp = _template(ctx, "public.outbox", "run_id = %s", [exp.run_id])
    queued = _template(ctx, "public.agent_runs", "run_id = %s", [fx.queued])

    def write(
        lease: Lease,
        cp_row: dict[str, Any],
        ob_row: dict[str, Any],
        *,
        step: int = 1,
        owner: str | None = None,
        epoch: int | None = None,
        bump: bool = True,
    ) -> tuple[tuple[sql.Composed | sql.SQL, list[Any]], ...]:
        """A protected write as plain SQL: the run's revision + ``step``, its
        checkpoint and its outbox row (one event id), under ``owner``/``epoch``."""
        event = str(uuid.uuid4())
        checkpoint = {
            **cp_row,
            "revision": lease.revision + step,
            "epoch": lease.epoch if epoch is None else epoch,
            "owner": lease.owner if owner is None else owner,
            "event_id": event,
        }
        event_row = {**ob_row, "event_id": event, "published_at": None}
        run = _stmt(
            "UPDATE public.agent_runs SET revision = revision + %s WHERE run_id = %s",
            step,
            lease.run_id,
        )
        body = (
            _insert("public.agent_checkpoints", cp_cols, checkpoint),
            _insert("public.outbox", ob_cols, event_row),
        )
        return (run, *body) if bump else body

    on_live = [
        Probe("protected write under a stale epoch", write(live, cp, ob, epoch=live.epoch - 1)),
        Probe("protected write under another owner", write(live, cp, ob, owner=INTRUDER)),
        Probe("revision + 2", write(live, cp, ob, step=2)),
        Probe("revision + 1 without checkpoint and event", write(live, cp, ob)[:1]),
        Probe("checkpoint and event without the revision", write(live, cp, ob, bump=False)),
        Probe(
            "outbox event alone",
            (
                _insert(
                    "public.outbox",
                    ob_cols,
                    {**ob, "event_id": str(uuid.uuid4()), "published_at": None},
                ),
            ),
        ),
        Probe(
            "intent registered outside a protected write",
            (
                _insert(
                    "public.tool_operations",
                    op_cols,
                    {
                        **op,
                        "operation_id": f"probe-{uuid.uuid4().hex[:12]}",
                        "step_id": "probe.step",
                        "idempotency_key": f"probe-{uuid.uuid4().hex}",
                    },
                ),
            ),
        ),
        Probe(
            "takeover of a live lease",
            (
                _stmt(
                    "UPDATE public.agent_runs SET epoch = epoch + 1, owner = %s,"
                    " lease_expires_at = clock_timestamp() + interval '1 second' WHERE run_id = %s",
                    INTRUDER,
                    live.run_id,
                ),
            ),
        ),
        Probe(
            "fencing token moved back",
            (
                _stmt(
                    "UPDATE public.agent_runs SET epoch = epoch - 1 WHERE run_id = %s", live.run_id
                ),
            ),
        ),
        Probe(
            "run completed without a protected write",
            (
                _stmt(
                    "UPDATE public.agent_runs SET status = 'succeeded', owner = NULL,"
                    " lease_expires_at = NULL WHERE run_id = %s",
                    live.run_id,
                ),
            ),
        ),
        Probe(
            "checkpoint rewritten",
            (
                _stmt(
                    "UPDATE public.agent_checkpoints SET owner = %s WHERE run_id = %s",
                    INTRUDER,
                    live.run_id,
                ),
            ),
        ),
        Probe(
            "ledger request changed",
            (
                _stmt(
                    "UPDATE public.tool_operations SET request_digest = 'probe-tampered'"
                    " WHERE run_id = %s",
                    live.run_id,
                ),
            ),
        ),
        Probe(
            "ledger prepared -> succeeded without a dispatch",
            (
                _stmt(
                    "UPDATE public.tool_operations SET status = 'succeeded', remote_id = 'probe',"
                    " revision = revision + 1 WHERE run_id = %s AND status = 'prepared'",
                    live.run_id,
                ),
            ),
        ),
        *(
            Probe(
                f"rows deleted from {t}",
                (_stmt(f"DELETE FROM public.{t} WHERE run_id = %s", live.run_id),),
            )
            for t in ("agent_checkpoints", "outbox", "tool_operations", "agent_runs")
        ),
    ]
    on_expired = [
        Probe("protected write by the holder of an expired lease", write(exp, cp_exp, ob_exp)),
        Probe(
            "renewal of an expired lease",
            (
                _stmt(
                    "UPDATE public.agent_runs SET lease_expires_at = clock_timestamp() + interval '1 second'"
                    " WHERE run_id = %s",
                    exp.run_id,
                ),
            ),
        ),
    ]
    control = [
        Probe(
            "cancel (control plane)",
            (
                _stmt(
                    "UPDATE public.agent_runs SET status = 'cancelled' WHERE run_id = %s", fx.queued
                ),
            ),
            control_plane=True,
        ),
        Probe(
            "new run (control plane)",
            (_insert("public.agent_runs", run_cols, {**queued, "run_id": str(uuid.uuid4())}),),
            control_plane=True,
        ),
    ]
    return [
        *on_live,
        *(dataclasses.replace(p, target="expired") for p in on_expired),
        *(dataclasses.replace(p, target="queued") for p in control),
    ]


def _in_state(ctx: ExperimentContext, fx: Fixture, target: str) -> bool:
    """The fixture run ``target`` is as the probe means it (superuser, database
    time): the live lease held by its holder and unexpired, the expired one
    expired and not taken over, the queued run queued."""
    if target == "queued":
        rows = ctx.env.query(
            "SELECT status = 'queued' AS ok FROM fencecheck_model.agent_runs WHERE run_id = %s",
            [fx.queued],
        )
    else:
        lease = fx.live if target == "live" else fx.expired
        rows = ctx.env.query(
            "SELECT owner IS NOT DISTINCT FROM %s AND epoch = %s AND revision = %s"
            " AND (lease_expires_at > clock_timestamp()) = %s AS ok"
            " FROM fencecheck_model.agent_runs WHERE run_id = %s",
            [lease.owner, lease.epoch, lease.revision, target == "live", lease.run_id],
        )
    return bool(rows and rows[0]["ok"])


def aimed(attempts: list[Attempt]) -> bool:
    """Every probe met its target as meant, or an earlier one already made a
    write (then the verdict is settled and later targets may have moved)."""
    made = False
    for a in attempts:
        if not a.aimed and not made:
            return False
        made = made or a.changes > 0 or a.outcome == "committed"
    return True


def attempt_all(
    ctx: ExperimentContext, fx: Fixture, role: str, kind: str, chosen: list[Probe]
) -> list[Attempt]:
    """Send every probe as ``role``, each in its own committed transaction and
    session (application_name ``fcprobe-<kind>-<n>``); judge each by the
    audit trail's changes of that session."""
    outcomes: dict[str, str] = {}
    apps: dict[str, str] = {}
    meant: dict[str, bool] = {}
    for n, probe in enumerate(chosen):
        meant[probe.name] = _in_state(ctx, fx, probe.target)
        app = f"{APP_PREFIX}{kind}-{n}"
        apps[probe.name] = app
        dsn = ctx.env.db.dsn(role, application_name=app)
        try:
            with closing(psycopg.connect(dsn, connect_timeout=5)) as conn:
                for stmt, params in probe.statements:
                    conn.execute(stmt, params)
                conn.commit()
            outcomes[probe.name] = "committed"
        except psycopg.Error as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            outcomes[probe.name] = f"refused ({exc.sqlstate}): {first[:160]}"
        ctx.queries.append(
            checkers.query_record(
                f"as {role}, committed: {probe.name}",
                "; ".join(s.as_string(None) for s, _ in probe.statements),
                (outcomes[probe.name], []),
            )
        )
    rows = ctx.sql(
        f"changes made by {role}'s probe sessions (audit trail)",
        "SELECT app, count(*) AS n FROM fencecheck_audit.changes WHERE app = ANY(%s) GROUP BY app",
        [list(apps.values())],
    )
    made = {str(r["app"]): int(r["n"]) for r in rows}
    return [
        Attempt(p.name, role, outcomes[p.name], made.get(apps[p.name], 0), meant[p.name])
        for p in chosen
    ]

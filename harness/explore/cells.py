"""Which cells of the contract's state space (harness/contract/state_space.py)
one experiment's evidence shows reached.

Only what the harness observed itself counts, never a worker's account:

* the state an operation started from comes from the audit trail: the row
  the operation's own first change replaced (its ``old``), or, for an
  operation that changed nothing (a refusal), the row as it stood at the
  audit sequence number the harness read just before sending it, provided
  no other session changed that row until the answer came (else the start
  is ambiguous and the operation is not counted);
* the relations come from the request the harness sent (the ops log of
  ``ExperimentContext.op``) compared with that start state, and from the
  mock tool's and the broker's own logs (the answer a dispatch or relay
  got, how the broker handed out messages);
* operations a ``run``-mode worker or the relay made on their own are read
  from the audit trail's changes that no logged request made: a grant
  (epoch + 1) is a claim, a moved expiry a renewal, a checkpoint insert a
  protected write, a ledger transition a dispatch or a reconciliation, an
  outbox row marked a publish, a dedup row a consumption. Refusals by such
  workers leave no trace and are not counted.

Invariant: :func:`observe` only names cells of the state space it is given,
and a dimension it has no reader for leaves the operation's cell unnamed
(counted nowhere), never guessed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.checking.invariants.model import Change
from harness.contract.state_space import StateSpace

#: The mock tool's create fault modes -> the answer a dispatch got.
TOOL_ANSWERS = {
    None: "ok",
    "delay": "ok",
    "slow_callback": "ok",
    "conflict_other_body": "conflict_other_body",
    "error_5xx_after_act": "error_after_act",
    "accept_without_result": "accepted_without_result",
    "answer_late": "answer_late",
    "arrive_late": "ok",
    "arrive_held": "ok",
    "reject_429": "reject_429",
    "reject_final": "refused_422",
    "drop_after_act": "no_answer",
    "hang": "no_answer",
}
DECISIONS = ("approve", "supplement", "terminate")
#: Refusals that say the operation never ran against the state (the session
#: may not call it, or the worker does not implement it): no cell.
NOT_PERFORMED = ("InsufficientPrivilege", "Unsupported")
FINDINGS = ("executed", "not_executed")
OUTCOMES = ("succeeded", "failed_final")


def _time(value: Any) -> float | None:
    """A timestamptz as to_jsonb writes it, in seconds since the epoch."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    text = str(value)
    if text == "-infinity":
        return float("-inf")
    if text == "infinity":
        return float("inf")
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


@dataclass
class _Rows:
    """One table's rows over audit time, by key: every version with its seq."""

    versions: dict[str, list[tuple[int, dict[str, Any] | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def add(self, key: str, seq: int, row: dict[str, Any] | None) -> None:
        self.versions[key].append((seq, row))

    def at(self, key: str, seq: int) -> dict[str, Any] | None:
        """The row as it stood after audit seq ``seq`` (None: not there yet)."""
        row: dict[str, Any] | None = None
        for s, r in self.versions.get(key, []):
            if s > seq:
                break
            row = r
        return row

    def changed_between(self, key: str, lo: int, hi: int) -> bool:
        return any(lo < s <= hi for s, _ in self.versions.get(key, []))


def _intact(row: Mapping[str, Any]) -> bool:
    """A checkpoint row's state matches its state_hash (contract section 6: the
    SHA-256 of the state as canonical JSON); a row without a hash counts as intact."""
    stored = row.get("state_hash")
    if not isinstance(stored, str) or not stored.startswith("\\x"):
        return True
    body = json.dumps(
        row.get("state_json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(body.encode()).hexdigest() == stored[2:].lower()


@dataclass
class Trail:
    """The audit trail indexed for the readers below."""

    changes: list[Change]
    runs: _Rows = field(default_factory=_Rows)
    ops: _Rows = field(default_factory=_Rows)
    tasks: _Rows = field(default_factory=_Rows)
    outbox: _Rows = field(default_factory=_Rows)
    by_seq: dict[int, Change] = field(default_factory=dict)
    ops_of_run: dict[str, list[tuple[int, str]]] = field(default_factory=lambda: defaultdict(list))
    # run_id -> (seq, schema_version, state matches its state_hash)
    checkpoints: dict[str, list[tuple[int, int, bool]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    consumed: dict[str, float] = field(default_factory=dict)  # event_id -> first consumed at

    @classmethod
    def of(cls, changes: Iterable[Change]) -> Trail:
        t = cls(sorted(changes, key=lambda c: c.seq))
        for c in t.changes:
            t.by_seq[c.seq] = c
            row = c.new if c.op != "DELETE" else None
            src = c.new or c.old or {}
            if c.table == "agent_runs":
                t.runs.add(str(src.get("run_id")), c.seq, row)
            elif c.table == "tool_operations":
                op_id = str(src.get("operation_id"))
                t.ops.add(op_id, c.seq, row)
                if c.op == "INSERT":
                    t.ops_of_run[str(src.get("run_id"))].append((c.seq, op_id))
            elif c.table == "agent_tasks":
                t.tasks.add(f"{src.get('tenant_id')}/{src.get('task_id')}", c.seq, row)
            elif c.table == "outbox":
                t.outbox.add(str(src.get("event_id")), c.seq, row)
            elif c.table == "agent_checkpoints" and c.op == "INSERT":
                t.checkpoints[str(src.get("run_id"))].append(
                    (c.seq, int(src.get("schema_version") or 0), _intact(src))
                )
            elif c.table == "consumed_events" and c.op == "INSERT":
                t.consumed.setdefault(str(src.get("event_id")), c.at)
        return t

    def last_grant(self, run_id: str, seq: int) -> dict[str, Any] | None:
        """The run's last version with an owner, up to ``seq`` (its last granted lease)."""
        found = None
        for s, r in self.runs.versions.get(run_id, []):
            if s > seq:
                break
            if r is not None and r.get("owner") is not None:
                found = r
        return found

    def unpublished(self, tenant: str, seq: int) -> int:
        """How many outbox rows of the tenant stood unpublished after audit seq ``seq``."""
        n = 0
        for key in self.outbox.versions:
            row = self.outbox.at(key, seq)
            if row and str(row.get("tenant_id")) == tenant and row.get("published_at") is None:
                n += 1
        return n

    def latest_op(self, run_id: str, seq: int) -> str | None:
        mine = [o for s, o in self.ops_of_run.get(run_id, []) if s <= seq]
        return mine[-1] if mine else None

    def others(self, run_id: str, op_id: str, seq: int) -> str:
        """Whether another operation of the run was in doubt (unknown or
        dispatching) after audit seq ``seq``: the ``others`` dimension."""
        for s, o in self.ops_of_run.get(run_id, []):
            row = self.ops.at(o, seq) if o != op_id and s <= seq else None
            if row is not None and row.get("status") in ("unknown", "dispatching"):
                return "in_doubt"
        return "none_in_doubt"


# ---------------------------------------------------------------- start states


def run_value(row: Mapping[str, Any] | None, at: float) -> str | None:
    if row is None:
        return None
    status = str(row.get("status"))
    if status == "queued":
        due = _time(row.get("next_attempt_at"))
        return "queued_backoff" if due is not None and due > at else "queued"
    if status in ("running", "waiting_tool"):
        return f"{status}_{lease_value(row, at)}"
    return status


def lease_value(row: Mapping[str, Any] | None, at: float) -> str | None:
    if row is None:
        return None
    if row.get("owner") is None:
        return "none"
    expires = _time(row.get("lease_expires_at"))
    return "live" if expires is not None and expires > at else "expired"


def ledger_value(row: Mapping[str, Any] | None, at: float) -> str:
    if row is None:
        return "none"
    status = str(row.get("status"))
    if status == "dispatching":
        until = _time(row.get("dispatch_until"))
        return "dispatching_live" if until is not None and until > at else "dispatching_expired"
    return status


# ---------------------------------------------------------------- the observer


@dataclass
class Sighting:
    """One operation placed in one cell, and why."""

    cell: str
    source: str  # "request" (the harness sent it) or "trail" (a worker did it on its own)
    evidence: str


@dataclass
class _Ctx:
    trail: Trail
    tool: Mapping[str, Any]
    replication: str
    capabilities: dict[str, str]
    space: StateSpace
    logged_creates: dict[str, Any] = field(default_factory=dict)  # task_id -> input
    logged_intents: dict[tuple[str, str, str], Any] = field(default_factory=dict)


def _cells(space: StateSpace, op: str, values: Mapping[str, str | None]) -> list[str]:
    """The ids of the op's cells these values belong to (:meth:`Cell.fits`: a
    dimension a cell leaves ``*`` takes any value, or none read); empty when
    a dimension a cell fixes has no value here, or no declared cell fits."""
    return [c.id for c in space.of(op) if c.fits(values)]


def _capability(ctx: _Ctx, tool: str | None) -> str | None:
    return ctx.capabilities.get(str(tool)) if tool else None


def _tool_request(ctx: _Ctx, op_id: str, lo: float, hi: float) -> dict[str, Any] | None:
    for r in ctx.tool.get("requests", []):
        if r.get("operation_id") == op_id and lo - 0.05 <= float(r.get("received_at") or 0) <= hi:
            return dict(r)
    return None


def _identity(
    args: Mapping[str, Any],
    grant: Mapping[str, Any] | None,
    trail: Trail,
    run_id: str,
    seq: int,
    app: str,
) -> str | None:
    """current / stale_epoch / other_owner: the (owner, epoch) sent vs the run's
    last granted lease. An omitted owner is the session's own: the owner of the
    grant of that epoch the same session took (audit trail)."""
    if grant is None or "epoch" not in args:
        return None
    epoch = int(args["epoch"])
    owner = args.get("owner")
    if owner is None:
        for c in trail.changes:
            if c.seq > seq:
                break
            if (
                c.table == "agent_runs"
                and c.app == app
                and c.new
                and str(c.new.get("run_id")) == run_id
                and c.new.get("epoch") == epoch
                and c.new.get("owner") is not None
            ):
                owner = c.new["owner"]
    current_epoch = int(grant.get("epoch") or 0)
    if epoch < current_epoch:
        return "stale_epoch"
    if epoch > current_epoch:
        return None
    return "current" if owner == grant.get("owner") else "other_owner"


def _requested(
    ctx: _Ctx,
    entry: Mapping[str, Any],
    own: list[Change],
    start: tuple[dict[str, Any], float] | None = None,
) -> list[Sighting]:
    """The cells of one request the harness sent (ExperimentContext.op's log).

    ``start``: the run row to judge it from and the moment (see
    :func:`_while_it_changed`), instead of the one the trail gives."""
    op = str(entry["op"])
    if entry.get("error") in NOT_PERFORMED:
        return []
    args: Mapping[str, Any] = entry.get("args") or {}
    before = int(entry.get("seq_before") or 0)
    after = int(entry.get("seq_after") or before)
    at = float(entry.get("at") or 0.0)
    done = float(entry.get("done") or at)
    trail = ctx.trail
    run_id = str(args["run_id"]) if args.get("run_id") else None
    first = own[0] if own else None
    start_at = first.at if first else at

    def run_start() -> dict[str, Any] | None:
        if run_id is None:
            return None
        if start is not None:
            return start[0]
        mine = next(
            (
                c
                for c in own
                if c.table == "agent_runs" and str((c.old or {}).get("run_id")) == run_id
            ),
            None,
        )
        if mine is not None:
            return mine.old
        if trail.runs.changed_between(run_id, before, after) and not own:
            return {"ambiguous": True}
        return trail.runs.at(run_id, before)

    values: dict[str, str | None] = {}
    row = run_start()
    if start is not None:
        start_at = start[1]
    if row is not None and row.get("ambiguous"):
        assert run_id is not None
        return _while_it_changed(ctx, entry, own, run_id, before, after, at, done)
    if op in ("renew", "heartbeat", "release", "save_checkpoint", "register_intent", "complete"):
        if run_id is None or row is None:
            return []
        values["lease"] = lease_value(row, start_at)
        grant = row if row.get("owner") is not None else trail.last_grant(run_id, before)
        values["identity"] = _identity(args, grant, trail, run_id, after, str(entry["worker"]))
        if "expected_revision" in args:
            values["revision"] = (
                "current"
                if int(args["expected_revision"]) == int(row.get("revision") or 0)
                else "stale"
            )
        if op == "register_intent":
            key = (run_id, str(args.get("step_id")), str(args.get("effect_version")))
            known = any(
                trail.ops.at(o, before) is not None
                and str((trail.ops.at(o, before) or {}).get("step_id")) == key[1]
                and str((trail.ops.at(o, before) or {}).get("effect_version")) == key[2]
                for _, o in trail.ops_of_run.get(run_id, [])
            )
            if not known:
                values["key"] = "new"
            elif key in ctx.logged_intents:
                values["key"] = (
                    "same_body" if ctx.logged_intents[key] == args.get("request") else "other_body"
                )
            if entry.get("ok"):
                ctx.logged_intents.setdefault(key, args.get("request"))
    elif op == "create_run":
        task = str(args.get("task_id"))
        if task in ctx.logged_creates:
            values["key"] = (
                "same_body" if ctx.logged_creates[task] == args.get("input") else "other_body"
            )
        else:
            values["key"] = "new"
            ctx.logged_creates[task] = args.get("input")
    elif op == "retry_run":
        task = str(args.get("task_id"))
        task_key = next((k for k in trail.tasks.versions if k.endswith("/" + task)), None)
        trow = trail.tasks.at(task_key, before) if task_key else None
        active = str(trow.get("active_run_id")) if trow and trow.get("active_run_id") else None
        arow = trail.runs.at(active, before) if active else None
        if arow is None:
            return []
        values["run_status"] = str(arow.get("status"))
        spent = int(arow.get("attempt_count") or 0) >= int(arow.get("max_attempts") or 1)
        values["budget"] = "spent" if spent else "left"
    elif op == "claim":
        if run_id is not None:
            values["target"] = "named"
            values["run"] = run_value(row, start_at)
        else:
            values["target"] = "any"
            granted = next(
                (
                    c
                    for c in own
                    if c.table == "agent_runs"
                    and c.old
                    and c.new
                    and c.new.get("epoch") != c.old.get("epoch")
                ),
                None,
            )
            if granted is None:
                return []
            values["run"] = run_value(granted.old, granted.at)
    elif op in ("cancel", "deliver_callback", "resolve_indoubt", "decide"):
        if row is None or run_id is None:
            return []
        values["run_status"] = str(row.get("status"))
        op_id = str(args.get("operation_id") or "") or trail.latest_op(run_id, before)
        orow = None
        if op_id:
            mine = next(
                (
                    c
                    for c in own
                    if c.table == "tool_operations" and (c.old or {}).get("operation_id") == op_id
                ),
                None,
            )
            orow = mine.old if mine else trail.ops.at(op_id, before)
        values["ledger"] = ledger_value(orow, start_at)
        if op in ("deliver_callback", "decide"):
            values["run_ref"] = _run_ref(trail, row, run_id, before)
        if op == "deliver_callback":
            made = {
                str(r.get("resource_id"))
                for r in ctx.tool.get("resources", [])
                if r.get("operation_id") == op_id
            }
            payload = args.get("payload") or {}
            values["payload"] = (
                "tool_resource" if str(payload.get("resource_id")) in made else "forged"
            )
        elif op == "resolve_indoubt":
            d = str(args.get("decision"))
            values["finding"] = d if d in FINDINGS else "outside"
            values["others"] = trail.others(run_id, op_id or "", before)
        elif op == "decide":
            d = str(args.get("decision"))
            values["decision"] = d if d in DECISIONS else "outside"
            supplied = dict(args.get("supplement") or {})
            have = dict(row.get("input") or {})
            fields = set(have) | set(dict(have.get("supplement") or {}))
            values["field"] = "present" if set(supplied) & fields else "new"
    elif op == "converge_operation":
        op_id = str(args.get("operation_id"))
        mine = next((c for c in own if c.table == "tool_operations"), None)
        orow = mine.old if mine else trail.ops.at(op_id, before)
        values["ledger"] = ledger_value(orow, start_at)
        o = str(args.get("outcome"))
        values["outcome"] = o if o in OUTCOMES else "outside"
        if orow is not None:
            op_run = str(orow.get("run_id"))
            values["others"] = trail.others(op_run, op_id, before)
            run_row = trail.runs.at(op_run, before)
            if run_row is not None:
                values["run_ref"] = _run_ref(trail, run_row, op_run, before)
    elif op == "dispatch":
        op_id = str(args.get("operation_id") or "")
        mine = next((c for c in own if c.table == "tool_operations"), None)
        if mine is not None:
            op_id = str((mine.old or mine.new or {}).get("operation_id"))
        orow = mine.old if mine else (trail.ops.at(op_id, before) if op_id else None)
        values["ledger"] = ledger_value(orow, start_at)
        # A dispatcher calls the tool only under its own claim: one that
        # claimed nothing sent nothing, whatever else reached the tool then.
        claimed_it = mine is not None and (mine.old or {}).get("status") == "prepared"
        req = _tool_request(ctx, op_id, at, done) if op_id and claimed_it else None
        values["tool_answer"] = TOOL_ANSWERS.get(req.get("fault_mode")) if req else "ok"
    elif op == "read_checkpoint":
        if run_id is None:
            return []
        versions = [(v, ok) for s, v, ok in trail.checkpoints.get(run_id, []) if s <= before]
        written = [v for vs in trail.checkpoints.values() for _, v, ok in vs if ok]
        current = max(written, default=0)
        if not versions:
            values["checkpoint"] = "none"
        else:
            v, intact = versions[-1]
            values["checkpoint"] = (
                "corrupt"
                if not intact
                else "current"
                if v == current
                else "older"
                if v < current
                else "unknown_version"
            )
    elif op == "durability":
        values["replication"] = ctx.replication
    elif op == "relay":
        # What it published is judged from the trail and the broker's log
        # (below), like a worker's own; a cycle that found the tenant's outbox
        # empty when it started is its own cell.
        tenant = entry.get("tenant")
        if not tenant or trail.unpublished(str(tenant), before) or own:
            return []
        values |= {"outbox": "empty", "broker_answer": "ack"}
    elif op == "reconcile":
        # What it changed is judged from the trail (below); every operation of
        # its tenant it had to look at (unknown, or a dispatch claim past its
        # deadline) and left as it was is a cycle in that cell too: a tool
        # with neither query nor a same-key promise leaves them unknown.
        tenant = entry.get("tenant")
        if not tenant:
            return []
        touched = {str((c.old or c.new or {}).get("operation_id")) for c in own}
        out: list[Sighting] = []
        for op_id in trail.ops.versions:
            row = trail.ops.at(op_id, before)
            if not row or str(row.get("tenant_id")) != str(tenant) or op_id in touched:
                continue
            state = ledger_value(row, at)
            if state not in ("unknown", "dispatching_expired"):
                continue
            cap = _capability(ctx, str(row.get("tool_name")))
            others = trail.others(str(row.get("run_id")), op_id, before)
            for cell in _cells(
                ctx.space, op, {"ledger": state, "capability": cap, "others": others}
            ):
                out.append(
                    Sighting(cell, "request", f"{entry['worker']}: reconcile left {op_id} {state}")
                )
        return out
    elif op == "consume":
        return []  # judged from the trail and the broker's log (below), like a worker's own
    outcome = "ok" if entry.get("ok") else entry.get("error")
    return [
        Sighting(cell, "request", f"{entry['worker']}: {op} at audit seq {before} ({outcome})")
        for cell in _cells(ctx.space, op, values)
    ]


def _run_ref(trail: Trail, row: Mapping[str, Any], run_id: str, before: int) -> str:
    """The named run is its task's active run, or one a retry superseded."""
    task_key = next(
        (k for k in trail.tasks.versions if k.endswith("/" + str(row.get("task_id")))), None
    )
    trow = trail.tasks.at(task_key, before) if task_key else None
    return "active" if trow and str(trow.get("active_run_id")) == run_id else "superseded"


def _while_it_changed(
    ctx: _Ctx,
    entry: Mapping[str, Any],
    own: list[Change],
    run_id: str,
    before: int,
    after: int,
    at: float,
    done: float,
) -> list[Sighting]:
    """A request that changed nothing while another session changed its run
    (a successor's renewal, say): placed only when every version of the row
    between the request and its answer, judged at both ends of the time it
    stood, gives the same cells (so whichever the request saw, it is that
    cell); else the start is ambiguous and it is not counted."""
    row = ctx.trail.runs.at(run_id, before)
    if row is None:
        return []
    stood: list[tuple[dict[str, Any], float, float]] = []
    since = at
    for seq, version in ctx.trail.runs.versions.get(run_id, []):
        if not before < seq <= after:
            continue
        moment = ctx.trail.by_seq[seq].at
        stood.append((row, since, max(since, moment)))
        if version is None:
            return []
        row, since = version, max(since, moment)
    stood.append((row, since, max(since, done)))
    placed: list[Sighting] | None = None
    for version, lo, hi in stood:
        for moment in (lo, hi):
            got = _requested(ctx, entry, own, (version, moment))
            if placed is None:
                placed = got
            elif {s.cell for s in got} != {s.cell for s in placed}:
                return []
    return placed or []


def _own_changes(trail: Trail, entry: Mapping[str, Any]) -> list[Change]:
    lo, hi = int(entry.get("seq_before") or 0), int(entry.get("seq_after") or 0)
    return [c for c in trail.changes if lo < c.seq <= hi and c.app == entry.get("worker")]


def _unrequested(ctx: _Ctx, claimed: set[int]) -> list[Sighting]:
    """Operations workers made on their own, read from the trail's changes that
    no logged request made."""
    out: list[Sighting] = []
    space = ctx.space
    by_tx: dict[int, list[Change]] = defaultdict(list)
    for c in ctx.trail.changes:
        by_tx[c.txid].append(c)

    def add(op: str, values: Mapping[str, str | None], c: Change, why: str) -> None:
        for cell in _cells(space, op, values):
            out.append(Sighting(cell, "trail", f"{c.app}: {why} (audit seq {c.seq})"))

    for c in ctx.trail.changes:
        if c.seq in claimed:
            continue
        old, new = c.old, c.new
        if c.table == "agent_runs" and c.op == "UPDATE" and old and new:
            if new.get("epoch") != old.get("epoch"):
                add(
                    "claim",
                    {"run": run_value(old, c.at), "target": "any"},
                    c,
                    f"grant epoch {new.get('epoch')}",
                )
            elif (
                new.get("owner") is not None
                and new.get("owner") == old.get("owner")
                and new.get("revision") == old.get("revision")
                and new.get("status") == old.get("status")
                and (_time(new.get("lease_expires_at")) or 0)
                > (_time(old.get("lease_expires_at")) or 0)
            ):
                add(
                    "renew",
                    {"lease": lease_value(old, c.at), "identity": "current"},
                    c,
                    "expiry moved",
                )
            elif (
                old.get("owner") is not None
                and new.get("owner") is None
                and new.get("status") == "queued"
            ):
                add(
                    "release",
                    {"lease": lease_value(old, c.at), "identity": "current"},
                    c,
                    "lease given up",
                )
        elif c.table == "agent_checkpoints" and c.op == "INSERT":
            tx = by_tx[c.txid]
            run_old = next((x.old for x in tx if x.table == "agent_runs" and x.old), None)
            run_new = next((x.new for x in tx if x.table == "agent_runs" and x.new), None)
            op = "save_checkpoint"
            if any(x.table == "tool_operations" and x.op == "INSERT" for x in tx):
                op = "register_intent"
            elif run_new is not None and run_new.get("status") == "succeeded":
                op = "complete"
            values = {
                "lease": lease_value(run_old, c.at),
                "identity": "current",
                "revision": "current",
                "key": "new",
            }
            add(op, values, c, f"protected write revision {(c.new or {}).get('revision')}")
        elif c.table == "tool_operations" and c.op == "UPDATE" and old and new:
            before, after = str(old.get("status")), str(new.get("status"))
            op_id = str(new.get("operation_id"))
            if before == "prepared" and after == "dispatching":
                req = _tool_request(ctx, op_id, c.at, float("inf"))
                answer = TOOL_ANSWERS.get(req.get("fault_mode")) if req else None
                add(
                    "dispatch",
                    {"ledger": "prepared", "tool_answer": answer},
                    c,
                    f"dispatch claim of {op_id}",
                )
            elif before in ("dispatching", "unknown") and after != before and c.app not in ("",):
                cap = _capability(ctx, str(new.get("tool_name")))
                state = ledger_value(old, c.at)
                if state in ("dispatching_expired", "unknown") and (
                    after == "unknown" or before == "unknown"
                ):
                    others = ctx.trail.others(str(new.get("run_id")), op_id, c.seq - 1)
                    add(
                        "reconcile",
                        {"ledger": state, "capability": cap, "others": others},
                        c,
                        f"{op_id} {before} -> {after}",
                    )
        elif (
            c.table == "outbox"
            and c.op == "UPDATE"
            and old
            and new
            and old.get("published_at") is None
            and new.get("published_at") is not None
        ):
            late = any(
                m.get("event_id") == new.get("event_id")
                and m.get("fault_mode") == "publish_ack_late"
                for m in ctx.tool.get("messages", [])
            )
            add(
                "relay",
                {"outbox": "unpublished", "broker_answer": "late_ack" if late else "ack"},
                c,
                "published",
            )
    for r in ctx.tool.get("refused_publishes", []):
        for cell in _cells(space, "relay", {"outbox": "unpublished", "broker_answer": "fail_one"}):
            out.append(
                Sighting(
                    cell, "trail", f"broker refused {r.get('event_id')} ({r.get('fault_mode')})"
                )
            )
    out += _deliveries(ctx)
    return out


def _deliveries(ctx: _Ctx) -> list[Sighting]:
    """consume cells from the broker's delivery log and the consumer's dedup
    rows: a read handed out out of order or twice is that delivery's cell; an
    ordinary one is new or seen by whether the consumer had already consumed
    one of its events (the dedup row's audit time) before it was handed out."""
    out: list[Sighting] = []
    kinds = {"deliver_duplicate": "duplicate", "deliver_reorder": "reorder"}
    for d in ctx.tool.get("deliveries", []):
        events = _delivered(d)
        if not events:
            continue
        at = float(d.get("delivered_at") or 0)
        mode = kinds.get(str(d.get("fault_mode")), "in_order")
        seen = any(ctx.trail.consumed.get(e, float("inf")) < at for e in events)
        values = {"consumer": "seen" if seen and mode == "in_order" else "new", "delivery": mode}
        for cell in _cells(ctx.space, "consume", values):
            out.append(
                Sighting(cell, "trail", f"broker delivery {d.get('id')} of {len(events)} ({mode})")
            )
    return out


def _delivered(delivery: Mapping[str, Any]) -> list[str]:
    """The event ids one broker read handed out, in order: the export's
    ``event_ids`` (a list), or the stored ``event_ids_json`` text."""
    ids = delivery.get("event_ids")
    if ids is None:
        try:
            ids = json.loads(delivery.get("event_ids_json") or "[]")
        except ValueError:
            return []
    return [str(e) for e in ids or []]


def observe(
    space: StateSpace,
    changes: Sequence[Change],
    ops_log: Sequence[Mapping[str, Any]],
    tool: Mapping[str, Any],
    *,
    replication: str | None,
    unplaced: list[str] | None = None,
) -> list[Sighting]:
    """Every operation of one experiment placed in its cell (see the module's
    invariants); each logged request placed in none is added to ``unplaced``
    (``op by worker at audit seq N (answer)``), so a reader sees what the
    evidence could not place (judged from the trail instead, its start
    ambiguous, or a reader missing)."""
    trail = Trail.of(changes)
    capabilities = {
        str(r.get("tool")): {
            "idempotent": "idempotent",
            "deterministic_id": "deterministic_id",
            "query": "query",
            "none": "none",
        }.get(str(r.get("capability")), "none")
        for r in tool.get("requests", [])
        if r.get("tool")
    }
    ctx = _Ctx(trail, tool, replication or "none", capabilities, space)
    out: list[Sighting] = []
    claimed: set[int] = set()
    for entry in sorted(ops_log, key=lambda e: float(e.get("at") or 0)):
        own = _own_changes(trail, entry)
        claimed.update(c.seq for c in own)
        placed = _requested(ctx, entry, own)
        out += placed
        trail_judged = entry.get("op") in ("reconcile", "relay", "consume")
        if not placed and unplaced is not None and not trail_judged:
            answer = "ok" if entry.get("ok") else entry.get("error")
            unplaced.append(
                f"{entry.get('op')} by {entry.get('worker')} at audit seq "
                f"{entry.get('seq_before')} ({answer})"
            )
        if trail_judged:
            claimed.difference_update(c.seq for c in own)  # judged from the trail below
    out += _unrequested(ctx, claimed)
    return out


def counts(sightings: Iterable[Sighting]) -> dict[str, int]:
    return dict(Counter(s.cell for s in sightings))

"""Operator decisions (contract section 7.7): the audit row tells what happened.

Each decision writes one ``operator_actions`` row with the run (and the
operation it names) ``before`` and ``after`` as JSON. Those snapshots are the
worker's own account of the decision; the harness's audit trail records the
same transaction's changes of ``agent_runs`` and ``tool_operations`` as the
triggers saw them, so each snapshot is judged against the rows themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness.checking.invariants.model import Change, Evidence, Finding, group
from harness.checking.invariants.registry import invariant

#: The run's fields a snapshot holds (contract section 7.7), and the operation's.
RUN_FIELDS = (
    "status",
    "revision",
    "epoch",
    "owner",
    "attempt_count",
    "max_attempts",
    "terminal_reason",
)
OPERATION_FIELDS = ("operation_id", "status", "remote_id", "revision")
# A commit is stamped a moment before other sessions see it: a row committed
# this close before a decision began may still have been the one it read.
VISIBILITY_SLACK_S = 0.05

Image = dict[str, Any] | None


@invariant(
    "operator.audit_shows_the_rows_before_and_after",
    "contract section 7.7; Chinese seed §12 (every operator decision audited: before/after)",
    "every operator_actions row of a decision on a run is the only decision of its transaction; "
    "its `before` is the run (and the operation it names) as they were just before that "
    "transaction changed them, and its `after` as the transaction left them, in every field "
    "the contract names that the audit trail records (a row the decision did not change: as "
    "it was while the decision ran)",
)
def audit_shows_rows_before_and_after(ev: Evidence) -> Finding:
    if ev.declares("operator_actions", "before") is False:
        return Finding(0, [], "the system keeps no before/after of operator decisions: not judged")
    decisions = _decisions_on_runs(ev)
    if not decisions:
        return Finding(0, [], "no operator decision on a run in this history")
    per_tx = group(decisions, lambda c: c.txid)
    timelines = group(
        (c for c in ev.changes if c.table in ("agent_runs", "tool_operations")),
        lambda c: (c.table, _key(c)),
    )
    run_fields = [f for f in RUN_FIELDS if ev.declares("agent_runs", f) is not False]
    op_fields = [f for f in OPERATION_FIELDS if ev.declares("tool_operations", f) is not False]
    bad: list[dict[str, Any]] = []
    for d in decisions:
        row = _decision(d)
        if len(per_tx[d.txid]) > 1:
            bad.append({**row, "why": "another decision shares its transaction"})
            continue
        run_id = str(d.row["run_id"])
        op_id = d.row.get("operation_id")
        runs = timelines.get(("agent_runs", run_id), [])
        if not runs:
            continue  # the trail never saw the run: nothing to judge it by
        # An operation the trail never saw (or none named) is not judged.
        ops = timelines.get(("tool_operations", str(op_id)), []) if op_id is not None else []
        for side in ("before", "after"):
            snapshot = d.row.get(side)
            if not isinstance(snapshot, dict):
                bad.append({**row, "part": side, "audit": snapshot, "why": "not the run as JSON"})
                continue
            parts: list[tuple[str, Any, list[Image], list[str]]] = [
                (side, snapshot, _images(runs, d, side), run_fields)
            ]
            if ops:
                images = [_of_run(i, run_id) for i in _images(ops, d, side)]
                parts.append((f"{side}.operation", snapshot.get("operation"), images, op_fields))
            for part, told, images, fields in parts:
                if any(not _differs(told, image, fields) for image in images):
                    continue
                bad.append(
                    {
                        **row,
                        "part": part,
                        "differs": _differs(told, images[-1], fields),
                        "trail_images": len(images),
                    }
                )
    return Finding(len(decisions), bad)


@invariant(
    "operator.a_decision_changes_only_its_run",
    "contract section 7.7 (cancel, decide, resolve_indoubt, converge_operation each name one run)",
    "a transaction holding an operator decision on a run changes no other run and no other "
    "run's operation: every agent_runs and tool_operations row it changed, as the audit trail "
    "saw it, is of the run the decision names",
)
def a_decision_changes_only_its_run(ev: Evidence) -> Finding:
    decisions = _decisions_on_runs(ev)
    if not decisions:
        return Finding(0, [], "no operator decision on a run in this history")
    named: dict[int, set[str]] = {}
    for d in decisions:
        named.setdefault(d.txid, set()).add(str(d.row["run_id"]))
    bad: list[dict[str, Any]] = []
    for c in ev.changes:
        if c.txid not in named or c.table not in ("agent_runs", "tool_operations"):
            continue
        # Both images: a row moved out of the named run is another run's change too.
        runs = {str(i["run_id"]) for i in (c.old, c.new) if i is not None and "run_id" in i}
        if runs - named[c.txid]:
            bad.append(
                {
                    "seq": c.seq,
                    "txid": c.txid,
                    "app": c.app,
                    "table": c.table,
                    "op": c.op,
                    "row": _key(c),
                    "of_run": sorted(runs),
                    "decision_names": sorted(named[c.txid]),
                }
            )
    return Finding(len(decisions), bad)


def _decisions_on_runs(ev: Evidence) -> list[Change]:
    """The audit rows of the workers' decisions that name a run (a purge names none)."""
    return [
        c
        for c in ev.of("operator_actions", "INSERT")
        if not c.by_harness and c.row.get("run_id") is not None
    ]


def _key(c: Change) -> str:
    return str(c.row.get("run_id" if c.table == "agent_runs" else "operation_id"))


def _decision(d: Change) -> dict[str, Any]:
    return {
        "seq": d.seq,
        "txid": d.txid,
        "app": d.app,
        "action": d.row.get("action"),
        "run_id": d.row.get("run_id"),
        "operation_id": d.row.get("operation_id"),
    }


def _images(timeline: list[Change], d: Change, side: str) -> list[Image]:
    """The row's images a snapshot of ``side`` may show, the likeliest last.

    Changed by the decision's transaction: before = the image its first
    change of the row found (the row as it was just before that transaction
    changed it: a snapshot read ahead of the row's lock may show an image
    another session replaced meanwhile, blind hunt 18 #03), after = the image
    its last change left. Untouched by it: any image the row had while the
    decision ran (another session may commit in between; a change audited
    after the decision's row was not visible to it)."""
    own = [c for c in timeline if c.txid == d.txid]
    if own:
        return [own[-1].new] if side == "after" else [own[0].old]
    earlier = [c for c in timeline if c.seq < d.seq and c.txid != d.txid]
    # A row's changes commit in audit order (each waits for the previous
    # one's row lock), so the image in force at the start is the last one
    # committed by then, and every later one may have been read.
    settled = [i for i, c in enumerate(earlier) if c.visible_at <= d.tx_start - VISIBILITY_SLACK_S]
    start = settled[-1] if settled else 0
    images: list[Image] = [] if settled else [None]
    images += [c.new for c in earlier[start:]]
    return images


def _of_run(image: Image, run_id: str) -> Image:
    """An operation's image as a snapshot of ``run_id`` shows it: none of another run's."""
    return image if image is not None and str(image.get("run_id")) == run_id else None


def _differs(told: Any, image: Image, fields: Iterable[str]) -> dict[str, Any]:
    """The fields where the audit's ``told`` differs from the trail's ``image``
    (each as [audit, trail]); a field the trail does not record is not judged."""
    if image is None or not isinstance(told, dict):
        return {} if told is None and image is None else {"row": [told, image]}
    return {
        f: [told.get(f), image.get(f)]
        for f in fields
        if f in image and not _same(told.get(f), image.get(f))
    }


def _same(a: Any, b: Any) -> bool:
    # Ids may be uuid in one place and text in another; numbers are numbers.
    if isinstance(a, str | int | float) and isinstance(b, str | int | float):
        if isinstance(a, bool) or isinstance(b, bool):
            return a == b
        return a == b or str(a) == str(b)
    return bool(a == b)

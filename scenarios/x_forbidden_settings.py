"""X: a worker started with lease settings the protocol forbids claims nothing.

The lease's timers are the deployment's to choose (contract section 2), but
some choices break the protocol before any fault: a lease of zero or less
expires as it is granted; a heartbeat interval as long as the lease lets it
run out between two renewals; a renewal with no time to answer can never be
confirmed; a duration that is not whole milliseconds ("10s", the
``Duration.String()`` of the English seed §5.1) read as a default or as
seconds hands out leases a thousand times longer than meant; an unknown
durability requirement silently asks for nothing. Each is refused at start
(the seed: the caller validates the TTL before it is used), never taken for
something else.

Each forbidden setting gets a queued run of its own and a ``run --once
--run-id`` worker with that setting: it must exit with a non-zero code and
change nothing (audit trail). A worker with the experiment's own settings
then claims and finishes the first of those runs: they were claimable.

An ops session without a data key (``FENCECHECK_DATA_KEY`` unset) is given
the planted sensitive field in clear, in a checkpoint and in an intent's
request: it must refuse both, never store or log the value in clear.

An ops session handed lines that are no request (not JSON, a list, a number,
``null``) answers each refused with ``id`` null and goes on serving.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from harness.checking import checkers
from harness.contract import needs
from harness.engine.experiment import ExperimentContext, ExperimentSpec
from harness.parts.processes import OpReply, OpTimeout, WorkerChannelClosed
from scenarios.common import control_plane, finish, new_run, planted_secret

# X judges refusals, not timing: the worker with sound settings gets timers a
# loaded machine cannot break (with the matrix's 800 ms lease and 300 ms
# renewal timeout, the Go worker's renewal queued behind its own checkpoint
# commit timed out beside the fresh-clone CI, and it cancelled itself).
LEASE_TTL_MS = 3000

#: (what is wrong, the environment that says it).
FORBIDDEN: tuple[tuple[str, dict[str, str | None]], ...] = (
    ("a lease of 0 ms", {"FENCECHECK_LEASE_TTL_MS": "0"}),
    ("a negative lease", {"FENCECHECK_LEASE_TTL_MS": "-800"}),
    ("a lease that is not whole milliseconds", {"FENCECHECK_LEASE_TTL_MS": "10s"}),
    ("a heartbeat interval of 0 ms", {"FENCECHECK_HEARTBEAT_MS": "0"}),
    # Every duration, not only the lease's: a lease "10s" read as 10 ms is
    # refused anyway (not longer than the heartbeat), so only these show a
    # parser that drops a unit instead of refusing it (blind bug hunt 22, #01).
    ("a heartbeat interval that is not whole milliseconds", {"FENCECHECK_HEARTBEAT_MS": "10s"}),
    (
        "a renewal timeout that is not whole milliseconds",
        {"FENCECHECK_HEARTBEAT_TIMEOUT_MS": "10s"},
    ),
    ("a dispatch claim that is not whole milliseconds", {"FENCECHECK_DISPATCH_TTL_MS": "10s"}),
    # Numbers that are no whole number as written: a parser of floats takes
    # them (truncated to 3000, read as 1000), a worker must refuse them
    # (blind hunt 67 #08: a Go setting parsed as a float and truncated).
    ("a lease of a fraction of a millisecond", {"FENCECHECK_LEASE_TTL_MS": f"{LEASE_TTL_MS}.5"}),
    ("a dispatch claim in exponent notation", {"FENCECHECK_DISPATCH_TTL_MS": "1e3"}),
    ("a heartbeat as long as the lease", {"FENCECHECK_HEARTBEAT_MS": str(LEASE_TTL_MS)}),
    ("a renewal timeout of 0 ms", {"FENCECHECK_HEARTBEAT_TIMEOUT_MS": "0"}),
    ("a dispatch claim of 0 ms", {"FENCECHECK_DISPATCH_TTL_MS": "0"}),
    ("an unknown durability requirement", {"FENCECHECK_REQUIRE_DURABILITY": "quorum"}),
    # Section 9: AES-256-GCM under a 32-byte key. A shorter one is no key of
    # that cipher: refused at start, never taken for AES-128 (blind hunt 33, #06).
    (
        "a data key of 16 bytes",
        {"FENCECHECK_DATA_KEY": base64.b64encode(bytes(range(16))).decode()},
    ),
    # Not a forbidden value but a deployment below it: X's primary has no
    # standby, so a worker that requires sync must not work here (exit 13).
    ("a durability requirement above the deployment's", {"FENCECHECK_REQUIRE_DURABILITY": "sync"}),
)
#: (what is wrong, the command-line options that say it): the contract's
#: flags, which win over the environment (a worker that read only the
#: environment would take the requirement for none, generated 15b7b171).
FORBIDDEN_FLAGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "a durability requirement above the deployment's, given as --require-durability",
        ("--require-durability", "sync"),
    ),
)

SPEC = ExperimentSpec(
    id="X",
    title="settings the protocol forbids",
    seed_section="English seed §5.1 (validate the TTL, integer milliseconds), §7 "
    "(heartbeat parameters); Chinese seed §5",
    invariant="a worker whose lease TTL, heartbeat interval, renewal timeout or dispatch "
    "claim is not a positive number of milliseconds, whose heartbeat is not shorter than its lease, or "
    "whose durability requirement is unknown or above the deployment's, or whose tenant is "
    "not its login role's binding, exits non-zero "
    "without changing anything; a "
    "worker with sound settings then claims and finishes the same run; a worker without a "
    "data key refuses a sensitive field it is given in clear",
    fault="one run --once worker per forbidden setting, each with a claimable run of its own",
    rules=(1, 8, 11),
    layer="queue",
    lease_ttl_ms=LEASE_TTL_MS,
    heartbeat_ms=500,
    heartbeat_timeout_ms=1500,
    dispatch_ttl_ms=5000,
    needs=needs.capabilities("workflow"),
)


def run(ctx: ExperimentContext) -> None:
    start = checkers.audit_mark(ctx)
    outcomes: list[tuple[str, str, str, int]] = []
    claimable: list[str] = []
    # The worker acts for one tenant and its login role is bound to another:
    # it would work the bound tenant's runs under the other's name (operation
    # ids, payloads), so it must not start (blind bug hunt round 4, #10: a
    # binding checked for existence, not equality).
    forbidden: tuple[tuple[str, dict[str, str | None], tuple[str, ...]], ...] = (
        *((what, env, ()) for what, env in FORBIDDEN),
        *((what, {}, flags) for what, flags in FORBIDDEN_FLAGS),
        (
            "a tenant other than its login role's binding",
            {"FENCECHECK_TENANT": ctx.env.other_tenant_id},
            (),
        ),
    )
    for n, (what, env, flags) in enumerate(forbidden, 1):
        name, run_id = f"X{n}", new_run(ctx)
        row = checkers.run_row(ctx, run_id, f"run for {what}, before its worker")
        if row["status"] == "queued" and row["owner"] is None:
            claimable.append(what)
        worker = ctx.env.start_worker(name, "run", ["--run-id", run_id, "--once", *flags], env=env)
        outcomes.append((what, name, run_id, finish(ctx, worker)))
    # The control plane started again under its name, as a restarted process
    # keeps its FENCECHECK_WORKER_ID, and given a sensitive value to seal: no
    # two sealed values may share a nonce (the global
    # effect.sealed_values_never_share_a_nonce; blind hunt 66 #03: nonces from
    # the worker id and a counter in process memory repeated after a restart).
    control_plane(ctx).stop()
    new_run(ctx)
    ctx.command("the control plane ctl stopped, started again under its name, one run created")
    ctx.fault(
        "each refused worker was handed a claimable run",
        len(claimable) == len(forbidden),
        expected=f"{len(forbidden)} runs, each queued with no owner when its worker started",
        observed=f"{len(claimable)} were: {claimable}",
    )
    for what, name, _run_id, code in outcomes:
        changed = checkers.changes_by(ctx, [name], after_seq=start)
        ctx.invariant(
            f"{what} refused",
            code != 0 and not changed,
            expected="a non-zero exit and no audited change by the worker",
            observed=f"exit {code}; {len(changed)} change(s)"
            + (f": {[(r['tbl'], r['op']) for r in changed]}" if changed else ""),
        )
    first = outcomes[0][2]
    # Sound settings include a durability requirement the deployment meets
    # exactly (none: X's primary has no standby): "below" is strict.
    ok = ctx.env.start_worker(
        "OK", "run", ["--run-id", first, "--once"], env={"FENCECHECK_REQUIRE_DURABILITY": "none"}
    )
    code = finish(ctx, ok)
    done = checkers.run_row(ctx, first, "the first run after the worker with sound settings")
    ctx.progress_equal(
        "a worker with sound settings (requiring exactly the deployment's durability) finished "
        "a run the first refused",
        done["status"],
        "succeeded",
        what=f"run status (OK exit {code})",
    )
    keyless = _without_a_data_key(ctx)
    other = _ops_for_another_tenant(ctx)
    _lines_that_are_no_request(ctx)
    _forged_sealed_values(ctx)
    _integers_that_are_no_integer(ctx)
    _inputs_that_are_no_object(ctx)
    checkers.lease_history_is_sound(ctx, [o[2] for o in outcomes] + keyless + [other])


def _ops_for_another_tenant(ctx: ExperimentContext) -> str:
    """An ``ops`` process told it acts for another tenant than its login
    role's binding must not work either: it exits at start or refuses, and
    changes nothing (blind hunt 50 #06: the Go worker checked
    the binding only in ``run`` mode and served a claim). Its run id."""
    run_id = new_run(ctx)
    mark = checkers.audit_mark(ctx)
    worker = ctx.env.start_worker("XOPS", "ops", env={"FENCECHECK_TENANT": ctx.env.other_tenant_id})
    try:
        reply: OpReply | None = worker.request("claim", {"run_id": run_id}, timeout_s=15)
    except Exception as exc:  # the process ended at start: no answer at all
        ctx.command(f"XOPS: claim got no answer ({type(exc).__name__}); exit {worker.returncode}")
        reply = None
    changed = checkers.changes_by(ctx, ["XOPS"], after_seq=mark)
    ctx.invariant(
        "an ops process acting for a tenant other than its login role's binding refused",
        (reply is None or not reply.ok) and not changed,
        expected="no claim granted (the process exits at start, or refuses); no audited change",
        observed=f"claim {'no answer' if reply is None else 'ok' if reply.ok else reply.error}; "
        f"{len(changed)} change(s)"
        + (f": {[(r['tbl'], r['op']) for r in changed]}" if changed else ""),
    )
    worker.stop(grace_s=2)
    return run_id


#: Lines on the ops channel that are no request: text that is not JSON, and
#: JSON that is no object.
NO_REQUESTS = ("this is no JSON", "[1, 2]", "42", "null")


def _lines_that_are_no_request(ctx: ExperimentContext) -> None:
    """An ``ops`` session handed lines that are no request answers each ``ok``
    false with ``id`` null and goes on answering (contract section 5): a
    garbled or hostile line never ends the session (generated 2e1342be: a
    JSON list failed in the Python server, and the session ended)."""
    worker = ctx.env.start_worker("XRAW", "ops")
    answers: list[str] = []
    wrong: list[str] = []
    slow: list[str] = []
    ended = False
    for text in (*NO_REQUESTS, None):
        what = repr(text) if text is not None else "the next request (durability)"
        try:
            if text is None:
                reply = worker.request("durability", {}, timeout_s=15)
            else:
                reply = worker.send_line(text).result(15.0)
        except OpTimeout:
            slow.append(what)
            break
        except WorkerChannelClosed:
            ended = True
            break
        answers.append(f"{what}: {'ok' if reply.ok else reply.error} (id {reply.id})")
        if text is not None and (reply.ok or reply.id is not None or reply.error != "BadRequest"):
            wrong.append(what)
    ctx.command(f"XRAW: {'; '.join(answers) or 'no answer'}")
    ctx.invariant(
        "lines that are no request are refused and the session goes on",
        not ended and not wrong,
        expected=f"each of {list(NO_REQUESTS)} answered ok false, BadRequest, with id null, then the "
        "next request answered, the process still serving",
        observed=f"{'; '.join(answers) or 'no answer'}"
        + (f"; the session ended: {worker.how_it_ended()}" if ended else ""),
    )
    ctx.progress(
        "every line answered in time",
        not slow,
        expected="each answer within 15 s",
        observed=f"no answer within 15 s to {slow}" if slow else "all answered",
    )
    worker.stop(grace_s=2)


def _forged_sealed_values(ctx: ExperimentContext) -> None:
    """Inputs that name the sealed mark (``$sealed``) but are no sealed value:
    a planted value given as the token under a sensitive key, and a planted
    sensitive field beside the mark. Each ``create_run`` is refused, or the
    run's stored input holds the value sealed; the global
    effect.sensitive_field_stored_sealed reads every row too (blind hunt 63's
    reader: both references kept any object naming the mark as sealed, so a
    hostile input was stored in clear)."""
    forged: dict[str, Callable[[str], dict[str, Any]]] = {
        "a planted value as the token": lambda v: {"card_number": {"$sealed": v}},
        "a planted field beside the mark": lambda v: {
            "billing": {"$sealed": "v1:AAAA", "payment_token": v}
        },
    }
    genuine = _a_genuine_sealed_value(ctx)
    if genuine is not None:
        # A token this deployment sealed itself (copied from a stored row),
        # with a planted field beside it: still no sealed value (blind hunt 71
        # #01: a check that the token decrypts, without the one-key rule,
        # stored the planted field in clear).
        forged["a planted field beside a genuine token"] = lambda v: {
            "billing": {"$sealed": genuine, "payment_token": v}
        }
    clear: list[str] = []
    told: list[str] = []
    for what, shape in forged.items():
        value = planted_secret(ctx)
        task = f"task-x-forged-{ctx.uuid()[:8]}"
        reply = ctx.op(control_plane(ctx), "create_run", task_id=task,
                       input={"tool": "idem", **shape(value)})  # fmt: skip
        told.append(f"{what}: {reply.error if not reply.ok else 'taken'}")
        if reply.ok:
            stored = ctx.sql(
                "the stored input of a run made from a forged sealed value",
                "SELECT input::text AS input FROM fencecheck_model.agent_runs WHERE run_id = %s",
                [str(reply.result.get("run_id"))],
            )
            if any(value in str(r["input"]) for r in stored):
                clear.append(what)
    ctx.invariant(
        "an input naming the sealed mark is refused or stored sealed",
        not clear,
        expected="each create_run refused, or the planted value sealed in the stored input",
        observed=f"{'; '.join(told)}; in clear: {clear or 'none'}",
    )


def _a_genuine_sealed_value(ctx: ExperimentContext) -> str | None:
    """A sealed token the worker stored in a run's input (every run of the
    harness carries sensitive fields); None when no stored input shows one."""
    rows = ctx.env.query("SELECT input FROM fencecheck_model.agent_runs ORDER BY run_id")
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            token = value.get("$sealed")
            if len(value) == 1 and isinstance(token, str):
                found.append(token)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for row in rows:
        walk(row["input"])
    return found[0] if found else None


#: create_run's max_attempts given a JSON value that is no integer (Python's
#: int() took true for 1 and "3" for 3; the contract's argument is an integer).
NO_INTEGERS: tuple[Any, ...] = (True, "3", 2.5)


def _integers_that_are_no_integer(ctx: ExperimentContext) -> None:
    """``create_run`` whose ``max_attempts`` is a JSON value other than an
    integer (``true``, ``"3"``, ``2.5``) is refused and adds no run; one whose
    ``max_attempts`` is null was given none, and gets the contract's 12 (blind
    hunt 66's reader: the Python worker took ``true`` for one attempt and
    refused null, the Go worker the other way round for null)."""
    _each_create_run_refused(
        ctx, "a max_attempts that is no JSON integer is refused", "max_attempts", NO_INTEGERS
    )
    task = f"task-x-attempts-{ctx.uuid()[:8]}"
    reply = ctx.op(control_plane(ctx), "create_run", task_id=task, input={"tool": "idem"},
                   max_attempts=None)  # fmt: skip
    rows = ctx.env.query(
        "SELECT max_attempts FROM fencecheck_model.agent_runs WHERE task_id = %s", [task]
    )
    ctx.invariant(
        "a max_attempts of null is none given: 12",
        reply.ok and [r["max_attempts"] for r in rows] == [12],
        expected="create_run with max_attempts null answered ok, its run's max_attempts 12",
        observed=f"reply {'ok' if reply.ok else reply.error}; max_attempts "
        f"{[r['max_attempts'] for r in rows]}",
    )


#: create_run's input given a JSON value that is no object (the Go worker took
#: each for an empty input and made the run; blind hunt 70's reader).
NO_OBJECTS: tuple[Any, ...] = (["tool", "idem"], "idem", 7)


def _inputs_that_are_no_object(ctx: ExperimentContext) -> None:
    """``create_run`` whose ``input`` is a JSON list, string or number is
    refused and adds no run: only an object (or none) is a run's input."""
    _each_create_run_refused(ctx, "an input that is no JSON object is refused", "input", NO_OBJECTS)


def _each_create_run_refused(
    ctx: ExperimentContext, name: str, arg: str, values: tuple[Any, ...]
) -> None:
    """A ``create_run`` (of a task of its own) with each of ``values`` as its
    ``arg`` is refused and adds no run."""
    told, made = [], []
    for value in values:
        task = f"task-x-{arg}-{ctx.uuid()[:8]}"
        args: dict[str, Any] = {"task_id": task, "input": {"tool": "idem"}, arg: value}
        reply = ctx.op(control_plane(ctx), "create_run", **args)
        rows = ctx.env.query(
            "SELECT run_id FROM fencecheck_model.agent_runs WHERE task_id = %s", [task]
        )
        told.append(f"{value!r}: {'ok' if reply.ok else reply.error}, {len(rows)} run(s)")
        if reply.ok or rows:
            made.append(repr(value))
    ctx.invariant(
        name,
        not made,
        expected=f"create_run with {arg} {', '.join(map(repr, values))} each refused, no run "
        "of its task",
        observed="; ".join(told),
    )


KEYLESS = "a worker without a data key refuses a sensitive field it is given"


def _without_a_data_key(ctx: ExperimentContext) -> list[str]:
    """An ops session started without FENCECHECK_DATA_KEY claims a run and is
    given the planted sensitive field in clear: in a checkpoint's state and in
    an intent's request. Without a key a worker refuses them (contract section
    9): both writes are refused, and the global
    effect.sensitive_field_stored_sealed and effect.sensitive_field_never_logged
    find the value in no row, change or log (a worker that skips sealing when no
    key is set stores it in clear). A run worker never meets a clear value here:
    the run's input is sealed at rest, and it fails to open it. The run ids."""
    caps = ctx.system.capabilities
    if not (caps.checkpoints and caps.offers_op("register_intent")):
        ctx.not_judged(
            KEYLESS,
            expected="judged where the system offers checkpoints and register_intent",
            observed="the system's mapping offers no checkpoints or no register_intent",
        )
        return []
    run_id = new_run(ctx)
    worker = ctx.env.start_worker("NOKEY", "ops", env={"FENCECHECK_DATA_KEY": None})
    lease = ctx.op(worker, "claim", run_id=run_id)
    ctx.fault(
        "a worker without a data key holds a lease (the writes are its own to refuse)",
        lease.ok and "FENCECHECK_DATA_KEY" not in worker.build_env(),
        expected="claim ok, the worker's environment without the key",
        observed=f"claim {'ok' if lease.ok else lease.error}",
    )
    if not lease.ok:
        return [run_id]
    identity = {"run_id": run_id, "epoch": lease.result["epoch"]}
    revision = lease.result["revision"]
    checkpoint = ctx.op(
        worker,
        "save_checkpoint",
        **identity,
        expected_revision=revision,
        state={"customer_token": planted_secret(ctx)},
    )
    intent = ctx.op(
        worker,
        "register_intent",
        **identity,
        expected_revision=revision,
        step_id="x.keyless",
        effect_version=1,
        tool="idem",
        request={"kind": "return_label", "customer_token": planted_secret(ctx)},
    )
    # And a run's result (blind hunt 66's reader: the Python `complete` stored
    # its result unsealed, where save_checkpoint sealed its state).
    done = (
        ctx.op(
            worker,
            "complete",
            **identity,
            expected_revision=revision,
            result={"customer_token": planted_secret(ctx)},
        )
        if caps.offers_op("complete")
        else None
    )
    ctx.invariant(
        KEYLESS,
        not checkpoint.ok and not intent.ok and not (done is not None and done.ok),
        expected="save_checkpoint, register_intent and complete (where offered) each refused "
        "(nothing stored in clear: the global sensitive-field invariants read every row and "
        "log)",
        observed=f"save_checkpoint {'ok' if checkpoint.ok else checkpoint.error}; "
        f"register_intent {'ok' if intent.ok else intent.error}; complete "
        + ("not offered" if done is None else "ok" if done.ok else str(done.error)),
    )
    return [run_id]

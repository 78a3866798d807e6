"""The gate: how a run's verdicts become the exit code a CI pipeline reads.

Default (``--fail-on fail``): 0 every experiment passed, 1 an invariant broke
somewhere, 2 nothing broke but something is *unknown* (a fault did not take
effect, or the harness could not decide). A pipeline may treat 2 apart from 1,
for instance retry it, or allow it as a warning (GitLab's
``allow_failure: exit_codes``). ``--fail-on unknown`` makes an unknown exit 1
like a fail, for gates that must not tell them apart. Either way an unknown
never exits 0: it proved nothing. An experiment the system declared not
applicable (it lacks an optional capability) neither passes nor fails: it
exits 0 and is named in the last line; ``--fail-on not_applicable`` makes it
exit 1 too (with every unknown), for a gate that wants every experiment
judged.

Whatever the code, the last line the command prints says it and, when it is
not 0, names every experiment behind it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from harness.evidence.summary import ExperimentResult, overall
from harness.verdict import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN, Verdict, exit_code

FAIL_ON = ("fail", "unknown", "not_applicable")


def add_gate_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default="fail",
        help="fail (default): exit 1 when an invariant broke, 2 when some verdict is unknown; "
        "unknown: an unknown verdict exits 1 like a fail; not_applicable: a not applicable "
        "verdict exits 1 too (see docs/ci.md)",
    )


def gate_exit(results: Sequence[ExperimentResult], fail_on: str) -> int:
    """The exit code for ``results``; no results at all is unknown, never a pass."""
    verdict = overall(results)
    if fail_on in ("unknown", "not_applicable") and verdict is Verdict.UNKNOWN:
        return EXIT_FAIL
    if fail_on == "not_applicable" and any(r.verdict is Verdict.NOT_APPLICABLE for r in results):
        return EXIT_FAIL
    return exit_code(verdict)


def gate_line(results: Sequence[ExperimentResult], fail_on: str) -> str:
    """The command's last line: its exit code and the experiments behind it."""
    code = gate_exit(results, fail_on)
    if not results:
        return f"fencecheck: exit {code}: no experiment ran, so nothing was proven"
    apart = [r for r in results if r.verdict is Verdict.NOT_APPLICABLE]
    if code == 0:
        judged = len(results) - len(apart)
        if not apart:
            return f"fencecheck: exit 0: all {len(results)} experiment run(s) passed"
        return (
            f"fencecheck: exit 0: all {judged} applicable experiment run(s) passed; "
            f"not applicable {_grouped(apart)}"
        )
    parts = []
    for verdict in (Verdict.FAIL, Verdict.UNKNOWN, Verdict.NOT_APPLICABLE):
        chosen = [r for r in results if r.verdict is verdict]
        if chosen:
            names = (
                _grouped(chosen)
                if verdict is Verdict.NOT_APPLICABLE
                else ", ".join(r.name for r in chosen)
            )
            parts.append(f"{verdict.words} {names}")
    policy = f" (--fail-on {fail_on})" if fail_on != "fail" else ""
    return f"fencecheck: exit {code}{policy}: {'; '.join(parts)}"


def _grouped(results: Sequence[ExperimentResult]) -> str:
    """Names, an experiment whose every run is among them said once (``E (6 runs)``):
    a system that lacks a layer makes whole experiments not applicable."""
    by_id: dict[str, list[ExperimentResult]] = {}
    for r in results:
        by_id.setdefault(r.experiment_id, []).append(r)
    out = []
    for experiment, group in by_id.items():
        if len(group) > 1:
            out.append(f"{experiment} ({len(group)} runs)")
        else:
            out.append(group[0].name)
    return ", ".join(out)


def mutants_gate(entries: Sequence[Mapping[str, Any]], fail_on: str) -> tuple[int, str]:
    """Exit code and last line of a mutant run (``mutants.json`` entries).

    1 when a mutant ran and no experiment failed it (the matrix missed a broken
    rule); otherwise 2 when some mutant was not run (an absent part: unknown,
    1 with ``--fail-on unknown``); 0 only when every mutant was caught.
    """
    escaped = [str(e["mutant"]) for e in entries if not e.get("not_run") and not e["caught_by"]]
    not_run = [str(e["mutant"]) for e in entries if e.get("not_run")]
    if escaped:
        code = EXIT_FAIL
    elif not_run or not entries:
        code = EXIT_FAIL if fail_on in ("unknown", "not_applicable") else EXIT_UNKNOWN
    else:
        return EXIT_PASS, f"fencecheck: exit 0: all {len(entries)} mutant(s) caught"
    parts = [f"not caught {', '.join(escaped)}"] if escaped else []
    parts += [f"not run {', '.join(not_run)}"] if not_run else []
    policy = f" (--fail-on {fail_on})" if fail_on != "fail" and not escaped else ""
    return code, f"fencecheck: exit {code}{policy}: {'; '.join(parts) or 'no mutant ran'}"

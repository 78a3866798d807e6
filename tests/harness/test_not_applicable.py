"""The fourth verdict (fast, no processes): an experiment the system declares it
lacks what it needs for is *not applicable*: shown apart everywhere, never a
fail, never an unknown, and only `--fail-on not_applicable` gates on it. The
mapping that declares it is validated, naming the field of every problem."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

import scenarios
from harness.contract import mapping, needs
from harness.evidence.gate import gate_exit, gate_line
from harness.evidence.summary import (
    ExperimentResult,
    write_junit,
    write_results_json,
    write_summary,
)
from harness.verdict import Verdict
from tests.hostile.declares_queue_only import MAPPING

QUEUE = mapping.parse(MAPPING, "tests.hostile.declares_queue_only")


def result(name: str, verdict: Verdict, variant: str | None = None) -> ExperimentResult:
    return ExperimentResult(
        name, "t", variant, 0, verdict, f"{verdict.value} here", 1.0, 0, None, ""
    )


def test_not_applicable_neither_passes_nor_fails() -> None:
    na = Verdict.NOT_APPLICABLE
    assert Verdict.merge([Verdict.PASS, na]) is Verdict.PASS
    assert Verdict.merge([Verdict.UNKNOWN, na]) is Verdict.UNKNOWN
    assert Verdict.merge([na, na]) is na
    results = [result("B", Verdict.PASS), result("E", na, "query"), result("E", na, "none")]
    assert gate_exit(results, "fail") == 0 and gate_exit(results, "unknown") == 0
    assert gate_exit(results, "not_applicable") == 1
    assert gate_line(results, "fail") == (
        "fencecheck: exit 0: all 1 applicable experiment run(s) passed; not applicable E (2 runs)"
    )


def test_every_report_shows_it_apart(tmp_path: Path) -> None:
    results = [result("B", Verdict.PASS), result("C", Verdict.NOT_APPLICABLE)]
    summary = write_summary(tmp_path / "s.md", results, header={}, wall_s=1).read_text()
    assert "1 pass, 0 fail, 0 unknown, 1 not applicable" in summary
    head, apart = summary.split("## Not applicable (1)")
    assert "| C |" not in head and "| C |" in apart
    junit = write_junit(tmp_path / "j.xml", results, suite="s").read_text()
    assert 'skipped="1"' in junit and '<skipped message="not_applicable here"' in junit
    data = json.loads(write_results_json(tmp_path / "r.json", results).read_text())
    assert [r["verdict"] for r in data["results"]] == ["pass", "not_applicable"]


def test_a_queue_declaration_declines_the_workflow_layer_only() -> None:
    by_id = {m.SPEC.id: m.SPEC for m in scenarios.all_modules()}
    assert needs.declined(by_id["B"].needs_for(None), QUEUE) is None
    assert needs.declined(by_id["K"].needs_for(None), QUEUE) is None
    assert needs.declined(by_id["R"].needs_for(None), QUEUE) is None
    why = needs.declined(by_id["C"].needs_for(None), QUEUE)
    assert why == (
        "not applicable: the system declares no checkpoints, revision_check, "
        "injection point after_lease_row_locked"
    )
    assert needs.declined(by_id["E"].needs_for("query"), mapping.default()) is None


def test_the_fencing_token_is_never_an_excuse() -> None:
    assert "fencing_token" not in mapping.CAPABILITIES
    for module in scenarios.all_modules():
        assert all(n.name != "fencing_token" for n in module.SPEC.needs)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("renewal: per_process", "renewal: per_job"), "capabilities.renewal"),
        (("  outbox: false\n", ""), "capabilities: 'outbox' is a required property"),
        (("before_renew]", "before_renew, after_nothing]"), "capabilities.injection_points"),
        (("revision_check: false", "revision_check: true"), "capabilities.revision_check"),
        (("mapping: 1", "mapping: 2"), "mapping: 1 was expected"),
    ],
)
def test_every_problem_names_its_field(change: tuple[str, str], field: str) -> None:
    with pytest.raises(mapping.MappingError) as caught:
        mapping.parse(MAPPING.replace(*change), "test")
    assert any(field in p for p in caught.value.problems), caught.value.problems


def test_the_reference_workers_declare_their_own() -> None:
    python = mapping.declared((sys.executable, "-m", "reference_impl.worker"))
    assert python.own and python.capabilities.lacks() == []
    assert python.capabilities.injection_points == mapping.default().capabilities.injection_points
    go = Path(__file__).resolve().parents[2] / "reference_impl/go/fencecheck-mapping.yaml"
    # The same but for the one thing a Go binary cannot offer: a clock the
    # harness sets back by preloading a library.
    go_caps = mapping.of_file(go).capabilities
    assert go_caps.lacks() == ["clock_skew"]
    assert dataclasses.replace(go_caps, clock_skew=True) == python.capabilities


def test_a_clock_that_cannot_be_set_back_declines_only_the_skewed_run() -> None:
    """The Go worker reads the kernel's clock itself (libfaketime cannot move
    it) and says so: the skewed variant is not applicable, its twin runs."""
    e = {m.SPEC.id: m.SPEC for m in scenarios.all_modules()}["E"]
    go = mapping.of_file(Path(__file__).parents[2] / "reference_impl/go/fencecheck-mapping.yaml")
    assert not go.capabilities.clock_skew and mapping.default().capabilities.clock_skew
    assert needs.declined(e.needs_for("frozen_dispatcher_clock_behind"), go) == (
        "not applicable: the system declares no clock_skew"
    )
    assert needs.declined(e.needs_for("frozen_dispatcher"), go) is None
    assert needs.declined(e.needs_for("frozen_dispatcher_clock_behind"), mapping.default()) is None

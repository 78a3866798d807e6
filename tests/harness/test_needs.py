"""What each experiment needs of a worker is declared beside its spec (fast, no
processes): every injection point a scenario arms, waits at or counts hits of
is one of its spec's needs, and the consequences of a missing one name the
experiment runs it leaves unjudged."""

from __future__ import annotations

import ast
import inspect
from types import ModuleType

import pytest

import scenarios
from harness.contract import needs
from harness.contract.needs import consequences

#: The ExperimentContext / control calls that arm or wait at an injection point,
#: and the index of their point argument (counting hits is no need: R only
#: times a wait on them).
POINT_CALLS = {"arm": 1, "reached": 1, "release": 1, "wait_reached": 1}


def points_named(module: ModuleType) -> set[str]:
    """Point names a module's calls pass as a literal or as a module constant."""
    tree = ast.parse(inspect.getsource(module))
    found: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in POINT_CALLS:
            continue
        index = POINT_CALLS[node.func.attr]
        args = [kw.value for kw in node.keywords if kw.arg == "point"]
        if len(node.args) > index:
            args.append(node.args[index])
        for arg in args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
            elif isinstance(arg, ast.Name) and isinstance(getattr(module, arg.id, None), str):
                found.add(getattr(module, arg.id))
    return found


#: Points an experiment arms only where the system hosts them (``hosts``),
#: judging the rest without: no need, since nothing is left unjudged. R[fast]
#: holds B's heartbeat at before_renew while its stop arrives, or else judges
#: the plain stop (a queue's adapter without the point still fails R). A
#: answers its restarted worker's intent point with a delay only where hosted.
HOSTED_ONLY = {"R": {"before_renew"}, "A": {"after_outbound_intent_commit"}}


@pytest.mark.parametrize("module", scenarios.all_modules(), ids=lambda m: m.SPEC.id)
def test_every_point_a_scenario_names_is_a_need(module: ModuleType) -> None:
    declared = needs.needed([module.SPEC], "point") | HOSTED_ONLY.get(module.SPEC.id, set())
    assert points_named(module) <= declared, sorted(points_named(module) - declared)


def test_the_scan_sees_the_points() -> None:
    """Not vacuous: the scan finds literal and constant points."""
    from scenarios import d_race_after_validation, s_link_faults

    assert points_named(d_race_after_validation) == {"after_lease_row_locked"}
    assert "after_dispatch_claim_commit" in points_named(s_link_faults)


def test_needs_name_only_their_variants() -> None:
    for module in scenarios.all_modules():
        spec = module.SPEC
        for need in spec.needs:
            assert set(need.variants) <= set(spec.variants), (spec.id, need)


def test_a_missing_boundary_point_names_its_variant() -> None:
    specs = [m.SPEC for m in scenarios.all_modules()]
    out = consequences(
        specs, [("point", "after_renew_commit"), ("op", "decide"), ("point", "nowhere")]
    )
    assert out[("point", "after_renew_commit")] == ["T[renew]"]
    assert out[("op", "decide")] == [
        "V[supplement]",
        "V[terminate]",
        "V[supplement_then_doubt]",
        "V[supplement_twice]",
        "V[supplement_after_budget]",
    ]
    assert out[("point", "nowhere")] == []
    shared = consequences(specs, [("point", "after_dispatch_claim_commit")])
    assert {"P", "E[frozen_dispatcher]", "T[claims_expired]"} <= set(
        shared[("point", "after_dispatch_claim_commit")]
    )

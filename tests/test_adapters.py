"""Each real system under test (harness/adapters/<system>) gets the verdicts its
published analysis states (docs/analyses/<system>.md, "Verdicts"): the whole
matrix runs against its thin driver, and a verdict that differs (the system
changed, or the harness did) fails here. The analysis is the one place the
expected table lives."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.harness.helpers import fencecheck_cli as fencecheck

pytestmark = [pytest.mark.slow, pytest.mark.matrix]

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = {
    "procrastinate": [sys.executable, "-m", "harness.adapters.procrastinate.driver"],
    "pgqueuer": [sys.executable, "-m", "harness.adapters.pgqueuer.driver"],
    "river": [str(ROOT / "harness/adapters/river/bin/fencecheck-river")],
}
EVERY_OTHER = "every other run"


def stated_verdicts(system: str) -> tuple[dict[str, str], str | None]:
    """The analysis's verdict table: explicit runs, and the verdict of every other run."""
    text = (ROOT / "docs/analyses" / f"{system}.md").read_text(encoding="utf-8")
    section = text.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    stated: dict[str, str] = {}
    default = None
    for name, verdict in re.findall(r"^\| ([^|]+?) \| ([a-z ]+?) \|$", section, flags=re.M):
        if name == "experiment":
            continue
        value = verdict.replace(" ", "_")
        if name == EVERY_OTHER:
            default = value
        else:
            stated[name] = value
    return stated, default


@pytest.mark.parametrize("system", ["procrastinate", "pgqueuer"])
def test_the_tables_parse(system: str) -> None:
    stated, default = stated_verdicts(system)
    assert stated == {"B": "fail", "K": "fail", "R": "fail"} and default == "not_applicable"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("system", sorted(ADAPTERS))
def test_the_system_gets_the_verdicts_its_analysis_states(system: str, tmp_path: Path) -> None:
    command = ADAPTERS[system]
    if not Path(command[-1]).exists() and command[0] != sys.executable:
        pytest.fail(f"{command[-1]} is not built: run `make setup`")
    done = fencecheck(
        "run", "--quiet", "--worker-cmd", " ".join(command), "--report-dir", str(tmp_path)
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # judged: no unknown, no error
    (run_dir,) = (p for p in tmp_path.iterdir() if not p.is_symlink())
    results = json.loads((run_dir / "results.json").read_text())["results"]
    got = {
        r["experiment"] + (f"[{r['variant']}]" if r["variant"] else ""): r["verdict"]
        for r in results
    }
    stated, default = stated_verdicts(system)
    want = {name: stated.get(name, stated.get(name.split("[")[0], default)) for name in got}
    differ = {n: (got[n], want[n]) for n in got if got[n] != want[n]}
    assert not differ, f"{system}: (got, stated in docs/analyses/{system}.md): {differ}"

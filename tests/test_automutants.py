"""A small fixed sample of generated mutants, end to end (what `make test` runs).

The whole set runs with `fencecheck mutants --auto` (README, docs/reference-impl.md);
here a handful of mutants with known outcomes prove the pipeline: a SQL and a
Python mutant each caught (and the catch confirmed against the unmutated
implementation), two mutants that break `migrate` reported as errors (never
as caught), a triaged-equivalent mutant not run. Nothing may be
left behind in the work directory.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from harness.cli.mutants import TRIAGE_FILE
from harness.engine.environment import DEFAULT_WORKER_CMD, Settings
from harness.mutation import auto_report, catalog, triage
from harness.mutation.auto import AutoOptions, entry, run_generated
from harness.mutation.named import list_mutants
from harness.mutation.ordering import CatcherOrder
from harness.mutation.sites import AutoMutant

pytestmark = [pytest.mark.mutants, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent

EXPECTED = {
    # renew without its expiry conjunct revives an expired lease: K.
    "reference_impl/sql/migrations/015_renew_locks_first.sql:fencecheck.renew:drop_conjunct:ab7b800f": "caught",
    # the heartbeat no longer cancels the execution on an unconfirmed renewal: P.
    "reference_impl/heartbeat.py:Heartbeat.on_unconfirmed:drop_call:bf812847": "caught",
    # the worker module no longer calls main(): migrate does nothing, no schema.
    "reference_impl/worker.py:<module>:drop_call:37225a58": "error",
    # migrate records the migrations without running them: no schema at all.
    "reference_impl/migrations.py:migrate:drop_call:8e7e387b": "error",
    # triaged equivalent (the list of applied names is only logged): not run.
    "reference_impl/migrations.py:migrate:drop_call:25b078d2": "equivalent",
}


@pytest.mark.timeout(900)
def test_fixed_sample_of_generated_mutants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mutants = catalog.generate(REPO)
    missing = sorted(set(EXPECTED) - {m.id for m in mutants})
    assert not missing, f"the code of these sample mutants changed; pick current ids: {missing}"
    chosen = catalog.select(mutants, list(EXPECTED))
    # Under /tmp and named fencecheck-*: the postgres OS user must reach the clusters.
    work = Path(tempfile.mkdtemp(prefix="fencecheck-test-automutants-"))
    try:
        _run_sample(mutants, chosen, work, tmp_path, capsys)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_sample(
    mutants: list[AutoMutant],
    chosen: list[AutoMutant],
    work: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = Settings(worker_cmd=DEFAULT_WORKER_CMD, work_dir=work)
    options = AutoOptions(
        repo_root=REPO,
        report_dir=tmp_path / "report",
        parallel=2,
        baseline=False,  # `make test` runs the whole matrix against the correct code already
    )
    # The named mutants' catchers put K and P first for the two caught ones.
    order = CatcherOrder((m.alters, m.catchers) for m in list_mutants(DEFAULT_WORKER_CMD))
    run = run_generated(
        settings, chosen, triage.load(TRIAGE_FILE), order, options, lambda m: print(m)
    )
    got = {o.mutant.id: o.status for o in run.outcomes}
    details = {o.mutant.id: o.detail for o in run.outcomes}
    print(capsys.readouterr().out)
    assert got == EXPECTED, details
    caught = [o for o in run.outcomes if o.status == "caught"]
    assert all("confirmed" in o.detail for o in caught)
    # by experiment id (K runs on each write path: K-fast, K-stepped)
    assert {o.mutant.id: sorted({c.split("-")[0] for c in o.caught_by}) for o in caught} == {
        "reference_impl/sql/migrations/015_renew_locks_first.sql:fencecheck.renew:drop_conjunct:ab7b800f": [
            "K"
        ],
        "reference_impl/heartbeat.py:Heartbeat.on_unconfirmed:drop_call:bf812847": ["P"],
    }
    entries = [entry(o, REPO) for o in run.outcomes]
    report = tmp_path / "report"
    auto_report.write(report, {"generated": len(mutants)}, entries)
    score = auto_report.score(len(mutants), entries)
    assert score.rate == 1.0 and score.counts["error"] == 2
    assert "**100.0%**" in (report / "summary.md").read_text()
    index = auto_report.publish(report)
    assert "NOT WRITTEN" not in index and (report / "index.html").is_file()
    # Each caught mutant's row links to the pages of the runs that caught it.
    page = (report / "index.html").read_text()
    assert page.count('href="mutants/') >= 2 and (report / "MANIFEST.sha256").is_file()
    assert list(work.iterdir()) == [], "a generated-mutant run left files behind"

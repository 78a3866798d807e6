"""Merging the parts of a sharded run: one run, no job twice, refusals, missing parts.

The parts here are run directories written with the real record and archive
writers (valid against the published schema); the verdicts in them are set by
the test, so every path of the merge (pass, fail, unknown, absent) is taken.
The slow test at the end merges parts that real `fencecheck run --shard`
processes wrote.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import scenarios
from harness.cli import main as cli_main
from harness.engine.runner import jobs_for
from harness.engine.shards import Shard
from harness.evidence import archive as evidence
from harness.evidence.merge import MergeRefused, merge
from harness.evidence.shard_record import (
    ShardRecord,
    job_items,
    named_items,
    read_record,
    write_record,
)
from harness.verdict import Verdict
from tests.harness.helpers import sample_archive as _archive

JOBS = jobs_for(scenarios.all_modules(), repeat=1)
DIGEST = "sha256:" + "d" * 64


def _record(count: int, index: int, **overrides: object) -> ShardRecord:
    record = ShardRecord(
        kind="run",
        run_id=f"part-{index}",
        shard_index=index,
        shard_count=count,
        seed=7,
        git_commit="c0ffee",
        worker_command="python -m reference_impl.worker",
        worker_digest=DIGEST,
        mutant=None,
        postgres_version="18.6",
        backend="local",
        items=tuple(job_items(JOBS, count)),
        host="test",
        started_at="2026-12-01T00:00:00+00:00",
        finished_at="2026-12-01T00:00:30+00:00",
        wall_s=30.0 + index,
    )
    return dataclasses.replace(record, **overrides)  # type: ignore[arg-type]


def _write_part(root: Path, record: ShardRecord, verdicts: dict[str, str] | None = None) -> Path:
    """A part's run directory: its shard.json and one valid archive per job of the part."""
    run_dir = root / f"part-{record.shard_index}-of-{record.shard_count}" / record.run_id
    run_dir.mkdir(parents=True)
    write_record(run_dir, record)
    for item in record.mine():
        verdict = (verdicts or {}).get(item.label, "pass")
        evidence.write_archive(
            run_dir / "archives" / f"{item.label}.yaml",
            _archive(
                experiment_id=item.experiment,
                variant=item.variant,
                repeat_index=item.repeat,
                title=item.title,
                git_commit=record.git_commit,
                worker={"command": record.worker_command, "digest": record.worker_digest},
                seed=record.seed,
                pass_or_fail=verdict,
                verdict_reason=f"{verdict} by the test",
            ),
        )
        (run_dir / "logs" / item.label).mkdir(parents=True)
        (run_dir / "logs" / item.label / "worker.log").write_text(item.label)
    return run_dir


def _parts(root: Path, count: int, verdicts: dict[str, str] | None = None) -> list[Path]:
    return [_write_part(root, _record(count, k), verdicts) for k in range(1, count + 1)]


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_merged_parts_are_the_whole_run_with_no_job_twice(tmp_path: Path, count: int) -> None:
    merged = merge(_parts(tmp_path / "in", count), tmp_path / "out")
    labels = [r.archive_path.stem for r in merged.results if r.archive_path]
    assert labels == [j.label for j in JOBS], "the merged run is the unsharded job list, in order"
    assert all(r.verdict is Verdict.PASS for r in merged.results)
    assert sorted(p.name for p in (tmp_path / "out" / "archives").iterdir()) == sorted(
        f"{j.label}.yaml" for j in JOBS
    )
    assert (tmp_path / "out" / "logs" / "H-async" / "worker.log").read_text() == "H-async"
    for name in ("summary.md", "junit.xml", "results.json", "merge.json", "MANIFEST.sha256"):
        assert (tmp_path / "out" / name).is_file()
    assert len(list((tmp_path / "out" / "shards").iterdir())) == count
    # Sealed like a run: the merged folder verifies as a whole.
    assert merged.digest.startswith("sha256:")
    assert cli_main(["verify", str(tmp_path / "out")]) == 0
    assert merged.wall_s == 30.0 + count  # the slowest part


def test_archives_are_copied_byte_for_byte(tmp_path: Path) -> None:
    parts = _parts(tmp_path / "in", 2)
    merge(parts, tmp_path / "out")
    for part in parts:
        for source in (part / "archives").iterdir():
            assert (tmp_path / "out" / "archives" / source.name).read_bytes() == source.read_bytes()


def test_cli_merge_exit_code_and_last_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = _parts(tmp_path / "in", 3, verdicts={"B": "fail", "O-request_lost": "unknown"})
    code = cli_main(["merge", *map(str, parts), "--into", str(tmp_path / "out")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 1
    assert last == "fencecheck: exit 1: fail B; unknown O[request_lost]"


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("git_commit", "deadbeef", "git_commit differs"),
        ("worker_digest", "sha256:" + "e" * 64, "worker_digest differs"),
        ("seed", 8, "seed differs"),
        ("postgres_version", "15.14", "postgres_version differs"),
    ],
)
def test_parts_of_different_runs_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object, named: str
) -> None:
    good = _write_part(tmp_path / "in", _record(2, 1))
    other = _write_part(tmp_path / "in", _record(2, 2, **{field: value}))
    code = cli_main(["merge", str(good), str(other), "--into", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 64
    assert named in err and str(value) in err
    assert not (tmp_path / "out").exists(), "a refused merge writes nothing"


def test_parts_of_different_split_sizes_are_refused(tmp_path: Path) -> None:
    two = _write_part(tmp_path / "in", _record(2, 1))
    three = _record(3, 2)
    with pytest.raises(MergeRefused, match=r"shard_count \(split size\) differs"):
        merge([two, _write_part(tmp_path / "in", three)], tmp_path / "out")


def test_parts_of_different_job_lists_are_refused(tmp_path: Path) -> None:
    one = _write_part(tmp_path / "in", _record(2, 1))
    items = tuple(job_items(jobs_for(scenarios.all_modules(), repeat=2), 2))
    other = _write_part(tmp_path / "in", _record(2, 2, items=items))
    with pytest.raises(MergeRefused, match=rf"item list and split differs .* {len(items)} items"):
        merge([one, other], tmp_path / "out")


def test_the_same_part_twice_is_refused(tmp_path: Path) -> None:
    first = _write_part(tmp_path / "a", _record(2, 1))
    again = _write_part(tmp_path / "b", _record(2, 1, run_id="again"))
    with pytest.raises(MergeRefused, match="the same part given more than once: 1/2"):
        merge([first, again], tmp_path / "out")


def test_a_missing_part_makes_its_jobs_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = _parts(tmp_path / "in", 3)
    absent = read_record(parts[1]).mine()
    code = cli_main(["merge", str(parts[0]), str(parts[2]), "--into", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 2
    assert "part 2/3 is missing" in out
    last = out.strip().splitlines()[-1]
    names = [f"{i.experiment}[{i.variant}]" if i.variant else str(i.experiment) for i in absent]
    assert last == f"fencecheck: exit 2: unknown {', '.join(names)}"
    results = (tmp_path / "out" / "results.json").read_text()
    assert results.count('"verdict": "unknown"') == len(absent)
    assert "not run: part 2/3 was not given to merge" in results


def test_fail_on_unknown_turns_a_missing_part_into_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = _parts(tmp_path / "in", 2)
    code = cli_main(
        ["merge", str(parts[0]), "--into", str(tmp_path / "out"), "--fail-on", "unknown"]
    )
    assert code == 1
    assert (
        capsys.readouterr()
        .out.strip()
        .splitlines()[-1]
        .startswith("fencecheck: exit 1 (--fail-on unknown): unknown ")
    )


def test_a_part_without_an_archive_makes_that_job_unknown(tmp_path: Path) -> None:
    parts = _parts(tmp_path / "in", 2)
    lost = read_record(parts[0]).mine()[0].label
    (parts[0] / "archives" / f"{lost}.yaml").unlink()
    merged = merge(parts, tmp_path / "out")
    by_label = {r.archive_path.stem: r for r in merged.results if r.archive_path}
    assert lost not in by_label
    unknown = [r for r in merged.results if r.verdict is Verdict.UNKNOWN]
    assert len(unknown) == 1 and f"has no archive for {lost}" in unknown[0].reason


def test_an_archive_of_another_run_is_unknown(tmp_path: Path) -> None:
    parts = _parts(tmp_path / "in", 2)
    label = read_record(parts[1]).mine()[0].label
    path = parts[1] / "archives" / f"{label}.yaml"
    evidence.write_archive(path, {**evidence.read_archive(path), "git_commit": "another"})
    merged = merge(parts, tmp_path / "out")
    unknown = [r for r in merged.results if r.verdict is Verdict.UNKNOWN]
    assert len(unknown) == 1 and "not of this run: git_commit 'another'" in unknown[0].reason


def test_into_must_be_new_or_empty(tmp_path: Path) -> None:
    parts = _parts(tmp_path / "in", 1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("keep me")
    with pytest.raises(MergeRefused, match="exists and is not empty"):
        merge(parts, tmp_path / "out")


def test_a_directory_without_runs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(MergeRefused, match="no run directory to merge"):
        merge([tmp_path / "empty"], tmp_path / "out")


def test_a_part_that_never_started_is_passed_over_and_its_jobs_are_unknown(
    tmp_path: Path,
) -> None:
    parts = _parts(tmp_path / "in", 2)
    (parts[1] / "shard.json").unlink()  # as a part that died before its services came up
    merged = merge([p.parent for p in parts], tmp_path / "out")
    assert merged.missing_parts == [2]
    assert any("has no shard.json" in why for why in merged.passed_over)
    assert {r.verdict for r in merged.results} == {Verdict.PASS, Verdict.UNKNOWN}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )


@pytest.mark.slow
def test_real_parts_run_at_once_merge_into_one_run(tmp_path: Path) -> None:
    """Two real `run --shard` processes at the same time, merged; then one part only."""
    repo = Path(__file__).resolve().parents[2]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.cli",
                "run",
                "A",
                "F",
                "--shard",
                f"{k}/2",
                "--seed",
                "11",
                "--quiet",
                "--report-dir",
                str(tmp_path / f"part{k}"),
            ],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for k in (1, 2)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    records = [read_record(next((tmp_path / f"part{k}").glob("2*"))) for k in (1, 2)]
    assert [r.shard for r in records] == [Shard(1, 2), Shard(2, 2)]
    # A and every variant of F: both parts list the whole plan.
    from scenarios import f_cancel_race

    planned = 1 + len(f_cancel_race.SPEC.variants)
    assert records[0].items == records[1].items and len(records[0].items) == planned
    assert all(r.finished_at and r.seed == 11 for r in records)
    whole = _cli(
        "merge",
        str(tmp_path / "part1"),
        str(tmp_path / "part2"),
        "--into",
        str(tmp_path / "m"),
        cwd=repo,
    )
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert (
        whole.stdout.strip().splitlines()[-1]
        == f"fencecheck: exit 0: all {planned} experiment run(s) passed"
    )
    half = _cli("merge", str(tmp_path / "part1"), "--into", str(tmp_path / "h"), cwd=repo)
    assert half.returncode == 2
    assert "part 2/2 is missing" in half.stdout


# ------------------------------------------------------------------ mutants
MUTANTS = {f"mutant_{i}": float(i % 4) for i in range(26)}


def _mutant_part(root: Path, count: int, index: int, escaped: tuple[str, ...] = ()) -> Path:
    items = named_items(MUTANTS, count)
    record = dataclasses.replace(
        _record(count, index), kind="mutants", items=tuple(items), run_id=f"mutants-{index}"
    )
    run_dir = root / f"mutants-part-{index}"
    run_dir.mkdir(parents=True)
    write_record(run_dir, record)
    entries = []
    for item in record.mine():
        (run_dir / item.label).mkdir()
        (run_dir / item.label / "evidence").write_text(item.label)
        caught = [] if item.label in escaped else ["K"]
        entries.append({"mutant": item.label, "caught_by": caught, "detail": "by the test"})
    (run_dir / "mutants.json").write_text(json.dumps(entries))
    return run_dir


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_mutant_parts_merge_into_the_whole_list(tmp_path: Path, count: int) -> None:
    parts = [_mutant_part(tmp_path / "in", count, k) for k in range(1, count + 1)]
    merged = merge(parts, tmp_path / "out")
    assert [e["mutant"] for e in merged.mutants] == list(MUTANTS)
    assert all(e["caught_by"] == ["K"] for e in merged.mutants)
    assert json.loads((tmp_path / "out" / "mutants.json").read_text()) == merged.mutants
    assert (tmp_path / "out" / "mutant_7" / "evidence").read_text() == "mutant_7"


def test_a_missing_mutant_part_is_not_run_and_an_escaped_mutant_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_run = [i.label for i in named_items(MUTANTS, 2) if i.shard == 2]
    escaped = not_run[1:3]
    first = _mutant_part(tmp_path / "in", 2, 1)
    second = _mutant_part(tmp_path / "in", 2, 2, escaped=tuple(escaped))
    code = cli_main(["merge", str(first), "--into", str(tmp_path / "a")])
    assert code == 2
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"fencecheck: exit 2: not run {', '.join(not_run)}"
    code = cli_main(["merge", str(first), str(second), "--into", str(tmp_path / "b")])
    assert code == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"fencecheck: exit 1: not caught {', '.join(escaped)}"
    )


def test_an_interrupted_part_is_named_unfinished_and_its_cut_jobs_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A part a stop cut (shard.json with `interrupted`, no `finished_at`, as
    write_run_reports leaves it) is listed as unfinished with its reason; the
    jobs it did not complete are unknown, so the merged run never passes."""
    whole = _write_part(tmp_path / "in", _record(2, 1))
    cut = _record(2, 2, finished_at=None).cut("interrupted by SIGTERM", 3.0)
    part = _write_part(tmp_path / "in", cut)
    dropped = sorted((part / "archives").iterdir())[1:]
    for path in dropped:  # the stop came before these ran
        path.unlink()
    assert read_record(part).interrupted == "interrupted by SIGTERM"
    code = cli_main(["merge", str(whole), str(part), "--into", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 2, out
    assert "did not finish: interrupted by SIGTERM" in out
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "2/2 (interrupted by SIGTERM)" in summary
    merged = json.loads((tmp_path / "out" / "results.json").read_text())
    verdicts = {
        r["experiment"] + (f"-{r['variant']}" if r["variant"] else ""): r["verdict"]
        for r in merged["results"]
    }
    assert dropped
    for path in dropped:
        assert verdicts[path.stem] == "unknown", (path.stem, verdicts)


@pytest.mark.parametrize("how", ["raised", "requested"])
def test_an_interrupted_merge_leaves_no_folder_that_says_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A stop while the pages are built: a signal raising where the main thread
    stands, or a stop the watcher thread recorded. Either way nothing is
    sealed, and what the merge wrote is removed (the parts are untouched)."""
    import harness.evidence.html as html
    from harness import stopping
    from harness.evidence.html import pages

    parts = _parts(tmp_path / "in", 1)
    before = sorted(p.relative_to(parts[0]) for p in parts[0].rglob("*"))
    real = pages.experiment_page
    calls: list[str] = []

    def page_then_stop(*args: object, **kwargs: object) -> object:
        calls.append(str(args[1]))
        if len(calls) == 5:
            if how == "raised":
                raise stopping.Interrupted("interrupted by SIGINT")
            stopping.request(why="interrupted by SIGINT")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    # In-process, a request must not arm the forced exit of a real stop (an
    # earlier in-process `cli_main` installed the signal handlers).
    monkeypatch.setattr(stopping, "_wakeup", None)
    monkeypatch.setattr(html, "experiment_page", page_then_stop)
    monkeypatch.setattr(html, "PARALLEL_FROM", 10_000)  # pages in this process
    into = tmp_path / "out"
    try:
        with pytest.raises(stopping.Interrupted):
            merge(parts, into)
    finally:
        stopping.reset()
    assert not into.exists(), sorted(into.rglob("*"))
    assert sorted(p.relative_to(parts[0]) for p in parts[0].rglob("*")) == before
    # Given an empty folder of the user's, the merge empties it again.
    into.mkdir()
    calls.clear()
    try:
        with pytest.raises(stopping.Interrupted):
            merge(parts, into)
    finally:
        stopping.reset()
    assert into.is_dir() and not any(into.iterdir())

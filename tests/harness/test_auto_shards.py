"""`mutants --auto --shard K/N` and `fencecheck merge` of its parts
(harness/mutation/auto_merge.py): the same split everywhere, every selected
mutant from its own part, a missing part's mutants not run, never caught."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.cli.common import REPO_ROOT
from harness.mutation import auto_report, catalog
from harness.mutation.auto import JOURNAL, RUN_FILE
from harness.mutation.auto_merge import AutoMergeRefused, find_auto_parts, merge_auto, part
from harness.mutation.sites import AutoMutant


@pytest.fixture(scope="module")
def selected() -> list[AutoMutant]:
    return catalog.select(catalog.generate(REPO_ROOT), sample=9, seed=4)


def test_the_parts_cover_the_selection_once_in_its_order(
    selected: list[AutoMutant],
) -> None:
    parts = [part(selected, k, 3) for k in (1, 2, 3)]
    ids = [m.id for p in parts for m in p]
    assert sorted(ids) == sorted(m.id for m in selected) and len(set(ids)) == len(ids)
    assert [m.id for m in parts[1]] == [m.id for m in selected[1::3]]


def _fake_part(root: Path, selected: list[AutoMutant], k: int, n: int, status: str) -> Path:
    folder = root / f"automutants-part{k}of{n}"
    (folder / "mutants").mkdir(parents=True)
    run: dict[str, Any] = {
        "generated": 1548,
        "selected": len(part(selected, k, n)),
        "selected_total": len(selected),
        "shard": f"{k}/{n}",
        "selected_ids": [m.id for m in selected],
        "sample": 9,
        "seed": 4,
        "language": None,
        "source_digest": catalog.source_digest(REPO_ROOT),
        "commit": "abc",
        "wall_s": 10.0 * k,
    }
    (folder / RUN_FILE).write_text(json.dumps(run))
    entries = [
        {**m.as_dict(), "status": status, "caught_by": ["A"] if status == "caught" else [],
         "wall_s": 1.0, "verdicts": {}, "detail": "", "note": None,
         "should_be_caught_by": [], "diff": None}
        for m in part(selected, k, n)
    ]  # fmt: skip
    (folder / JOURNAL).write_text("".join(json.dumps(e) + "\n" for e in entries))
    auto_report.write(folder, run, entries)
    return folder


def test_merge_takes_each_mutant_from_its_part_and_a_missing_part_is_not_run(
    tmp_path: Path, selected: list[AutoMutant]
) -> None:
    one = _fake_part(tmp_path / "a", selected, 1, 3, "caught")
    two = _fake_part(tmp_path / "b", selected, 2, 3, "survived")
    assert find_auto_parts([tmp_path / "a", tmp_path / "b"]) == [one, two]
    merged = merge_auto([one, two], tmp_path / "merged", REPO_ROOT)
    assert merged.missing == [3]
    by_id = {e["id"]: e["status"] for e in merged.entries}
    assert [by_id[m.id] for m in selected] == ["caught", "survived", "not_run"] * 3
    assert merged.score is not None and merged.score.counts["not_run"] == 3
    data = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert data["selected"] == 9 and data["counts"]["caught"] == 3
    assert (tmp_path / "merged" / "MANIFEST.sha256").is_file()
    assert (tmp_path / "merged" / "shards" / "2-of-3" / RUN_FILE).is_file()


def test_parts_of_different_campaigns_or_twice_the_same_are_refused(
    tmp_path: Path, selected: list[AutoMutant]
) -> None:
    one = _fake_part(tmp_path / "a", selected, 1, 3, "caught")
    again = _fake_part(tmp_path / "b", selected, 1, 3, "caught")
    with pytest.raises(AutoMergeRefused, match="given twice"):
        merge_auto([one, again], tmp_path / "m1", REPO_ROOT)
    other = _fake_part(tmp_path / "c", selected, 2, 3, "caught")
    run = json.loads((other / RUN_FILE).read_text())
    (other / RUN_FILE).write_text(json.dumps({**run, "seed": 5}))
    with pytest.raises(AutoMergeRefused, match="seed"):
        merge_auto([one, other], tmp_path / "m2", REPO_ROOT)

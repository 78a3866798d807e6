"""The pages take an archive's value as this process wrote it only while the
file still holds exactly the text written; an edited or replaced file is
parsed (and judged) like any other."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from harness.evidence import written


def test_recall_gives_the_value_while_the_file_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "A.yaml"
    path.write_text("experiment_id: A\n")
    written.remember(path, "experiment_id: A\n", {"experiment_id": "A"})
    kept = written.recall(path)
    assert kept is not None and pickle.loads(kept) == {"experiment_id": "A"}


def test_an_edited_or_removed_file_is_not_recalled(tmp_path: Path) -> None:
    path = tmp_path / "B.yaml"
    path.write_text("pass_or_fail: fail\n")
    written.remember(path, "pass_or_fail: fail\n", {"pass_or_fail": "fail"})
    path.write_text("pass_or_fail: pass\n")  # an edit after the run wrote it
    assert written.recall(path) is None
    path.unlink()
    assert written.recall(path) is None
    assert written.recall(tmp_path / "never-written.yaml") is None


def test_the_kept_values_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(written, "LIMIT", 4096)
    paths = []
    for i in range(8):
        path = tmp_path / f"{i}.yaml"
        text = f"n: {i}\n"
        path.write_text(text)
        written.remember(path, text, {"n": i, "pad": "x" * 1000})
        paths.append(path)
    assert written.recall(paths[0]) is None  # the oldest went first
    assert written.recall(paths[-1]) is not None

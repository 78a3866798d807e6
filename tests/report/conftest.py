"""Run folders built from real archives kept under fixtures/ (a passing run of
B and H[sync_cancelled_wait]; a mutant run where B fails and K passes), plus
an unknown, an unreadable and a newer-format archive made from them."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

FIXTURES = Path(__file__).parent / "fixtures"


def load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load(path.read_bytes(), Loader=yaml.CSafeLoader)
    return loaded


def dump(path: Path, archive: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(archive, sort_keys=False, allow_unicode=True))


def as_unknown(archive: dict[str, Any]) -> dict[str, Any]:
    """The archive as if its fault had not taken effect: verdict unknown."""
    changed = dict(archive)
    checks = [dict(c) for c in archive["checks"]]
    fault = next(c for c in checks if c["kind"] == "fault")
    fault["ok"] = False
    fault["observed"] = "A was still running when B claimed"
    changed["checks"] = checks
    changed["pass_or_fail"] = "unknown"
    changed["verdict_reason"] = f"fault did not take effect: {fault['name']}"
    return changed


def as_newer(archive: dict[str, Any]) -> dict[str, Any]:
    """The archive as a newer version might write it: without optional fields,
    with fields (and a shape) this version's published schema does not know."""
    changed = {
        k: v
        for k, v in archive.items()
        if k not in ("audit_trail", "signals", "timeline", "failover", "mock_tool_resources")
    }
    changed["experiment_id"] = "C"
    changed["pass_or_fail"] = "fail"
    changed["verdict_reason"] = "invariant broken: one owner per epoch"
    changed["global_invariants"] = [
        {"name": "epochs only grow", "ok": True, "rows": []},
        {
            "name": "one owner per epoch",
            "ok": False,
            "rows": [{"run_id": "r1", "epoch": 2, "owners": "A/1, B/2"}],
        },
    ]
    changed["worker_metrics"] = {"lease_renew_total": {"success": 3, "lost": 1}}
    return changed


@pytest.fixture
def run_pass(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "run-pass", tmp_path / "run-pass"))


@pytest.fixture
def run_fail(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "run-fail", tmp_path / "run-fail"))


@pytest.fixture
def run_mixed(tmp_path: Path) -> Path:
    """pass (B), fail (B from the mutant run), unknown, and two unreadable: a newer
    format (fails the schema) and one that is not YAML."""
    root = tmp_path / "run-mixed"
    archives = root / "archives"
    archives.mkdir(parents=True)
    shutil.copy(FIXTURES / "run-pass" / "archives" / "B.yaml", archives / "B.yaml")
    shutil.copy(FIXTURES / "run-fail" / "archives" / "B.yaml", archives / "B-r1.yaml")
    passed = load(FIXTURES / "run-pass" / "archives" / "B.yaml")
    dump(archives / "B-r2.yaml", {**as_unknown(passed), "repeat_index": 2})
    dump(archives / "C.yaml", as_newer(passed))
    (archives / "D.yaml").write_bytes(b"experiment_id: D\n  bad: [indent\n\x00")
    shutil.copytree(FIXTURES / "run-pass" / "logs", root / "logs")
    return root


Build = Callable[[Path], Path]

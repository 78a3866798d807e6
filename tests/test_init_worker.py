"""`fencecheck init-worker`: the template it writes stands alone and passes
`fencecheck contract` as written (docs/worker-contract.md section 12)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import init_worker
from tests.harness.helpers import fencecheck_cli as fencecheck

ROOT = Path(__file__).resolve().parent.parent


def test_the_python_template_stands_alone_with_the_contracts_schema(tmp_path: Path) -> None:
    done = fencecheck("init-worker", "--lang", "python", str(tmp_path / "w"))
    assert done.returncode == 0, done.stdout + done.stderr
    names = sorted(p.name for p in (tmp_path / "w").iterdir())
    assert names == ["README.md", "protocol.sql", "schema.sql", "worker.py"]
    shipped = (ROOT / "harness" / "contract" / "schema.sql").read_text()
    assert (tmp_path / "w" / "schema.sql").read_text() == shipped
    assert "fencecheck contract --worker-cmd" in done.stdout
    worker = (tmp_path / "w" / "worker.py").read_text()
    assert "TODO" not in worker and "from harness" not in worker and "reference_impl" not in worker


def test_it_never_overwrites_without_force(tmp_path: Path) -> None:
    init_worker.write("python", tmp_path)
    done = fencecheck("init-worker", str(tmp_path))
    assert done.returncode == 64, done.stdout + done.stderr
    assert "already has" in done.stderr + done.stdout and "--force" in done.stderr + done.stdout
    assert fencecheck("init-worker", "--force", str(tmp_path)).returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_python_template_is_conformant_out_of_the_box(tmp_path: Path) -> None:
    init_worker.write("python", tmp_path / "w")
    command = f"{sys.executable} {tmp_path / 'w' / 'worker.py'}"
    done = fencecheck("contract", "--quiet", "--worker-cmd", command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CONFORMANT: no gap found" in done.stdout
    # Conformant is not the whole truth: what the template does not offer is
    # named with the experiment runs it leaves unjudged.
    assert "injection point after_renew_commit: never reached" in done.stdout
    assert "-> T[renew]" in done.stdout
    assert "optional op decide: answers Unsupported -> V (5 runs)" in done.stdout
    assert "optional op resolve_indoubt: answers Unsupported -> J[operator_resolves]" in done.stdout


def test_the_go_template_stands_alone(tmp_path: Path) -> None:
    init_worker.write("go", tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["README.md", "go.mod", "go.sum", "main.go", "protocol.sql", "schema.sql"]
    assert "//go:embed schema.sql protocol.sql" in (tmp_path / "main.go").read_text()


def _go_build_offline(directory: Path) -> str | None:
    """Build the Go template from the module cache alone; why not, or None."""
    go = shutil.which("go")
    if go is None:
        return "no go on PATH"
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off"}
    done = subprocess.run(
        [go, "build", "-o", "worker", "."],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return None if done.returncode == 0 else f"go build offline failed: {done.stderr[-500:]}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_go_template_is_conformant_out_of_the_box(tmp_path: Path) -> None:
    init_worker.write("go", tmp_path / "w")
    why = _go_build_offline(tmp_path / "w")
    if why is not None:
        pytest.skip(why)
    done = fencecheck("contract", "--quiet", "--worker-cmd", str(tmp_path / "w" / "worker"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CONFORMANT: no gap found" in done.stdout

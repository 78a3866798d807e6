"""The ready-to-use pipeline files under docs/ci/, checked offline.

* GitHub Actions: actionlint (built by `make setup` into .tools/bin: syntax,
  expressions and their types, job needs, the inputs of well-known actions,
  runner labels) and the workflow JSON Schema that check-jsonschema ships.
* GitLab CI: the GitLab CI JSON Schema that check-jsonschema ships.
* Kubernetes: kubernetes-validate in strict mode (unknown fields refused)
  against the API schemas of Kubernetes 1.33 that it ships.
* Every `fencecheck` command line in them parses with fencecheck's own
  parser, and the part count N is the same wherever a file states it.

What this cannot prove: that a runner, a registry or a cluster accepts the
files (no GitHub, GitLab or Kubernetes is reachable here), that the actions'
own behaviour matches, or GitLab rules only its server resolves
(`include`, `extends` merged with `needs`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
CI = REPO / "docs" / "ci"
GITHUB = CI / "github" / "fencecheck.yml"
GITLAB = CI / "gitlab" / "fencecheck.gitlab-ci.yml"
KUBERNETES = sorted((CI / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSION = "1.33.0"
BIN = Path(sys.executable).parent


def _actionlint() -> str:
    found = shutil.which("actionlint") or str(REPO / ".tools" / "bin" / "actionlint")
    if not os.access(found, os.X_OK):
        pytest.fail("actionlint is not built: run `make setup` (go install into .tools/bin)")
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)


def _github_lint(path: Path) -> list[subprocess.CompletedProcess[str]]:
    return [
        _run(_actionlint(), "-no-color", str(path)),
        _run(
            str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)
        ),
    ]


def _gitlab_lint(path: Path) -> list[subprocess.CompletedProcess[str]]:
    return [_run(str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.gitlab-ci", str(path))]


def _kubernetes_lint(path: Path) -> list[subprocess.CompletedProcess[str]]:
    return [_run(str(BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION, str(path))]


def _assert_clean(results: list[subprocess.CompletedProcess[str]]) -> None:
    for r in results:
        assert r.returncode == 0, f"{' '.join(r.args)}:\n{r.stdout}{r.stderr}"


def test_github_workflow_is_valid() -> None:
    _assert_clean(_github_lint(GITHUB))


def test_gitlab_pipeline_is_valid() -> None:
    _assert_clean(_gitlab_lint(GITLAB))


@pytest.mark.parametrize("path", KUBERNETES, ids=[p.name for p in KUBERNETES])
def test_kubernetes_manifests_are_valid(path: Path) -> None:
    _assert_clean(_kubernetes_lint(path))


def test_the_linters_catch_a_broken_file(tmp_path: Path) -> None:
    """Each check fails on a file with one mistake: it can fail."""
    github = yaml.safe_load(GITHUB.read_text())
    github["jobs"]["merge"]["needs"] = "no-such-job"
    gitlab = yaml.safe_load(GITLAB.read_text())
    gitlab["fencecheck-merge-pg18"]["when"] = "sometimes"
    kube = list(yaml.safe_load_all(KUBERNETES[-1].read_text()))
    kube[-1]["spec"]["completionsMode"] = "Indexed"  # misspelt field
    for name, data, lint in (
        ("gh.yml", github, _github_lint),
        ("gl.yml", gitlab, _gitlab_lint),
        ("k8s.yaml", kube, _kubernetes_lint),
    ):
        path = tmp_path / name
        path.write_text(yaml.safe_dump_all(data) if name == "k8s.yaml" else yaml.safe_dump(data))
        assert any(r.returncode != 0 for r in lint(path)), f"{name}: a broken file passed"


# A fencecheck command line in a pipeline file: from the command to the end of
# the (folded) line or shell statement.
COMMAND = re.compile(r"(?:\.venv/bin/fencecheck|fencecheck-entrypoint)\s+((?:run|merge)\b[^;\n]*)")


def _commands(text: str) -> list[str]:
    folded = re.sub(r"\n\s*(?=--)", " ", text)  # YAML folded scalars continue lines
    return COMMAND.findall(folded)


def _with_sample_values(command: str) -> list[str]:
    command = re.sub(r"\$\{\{[^}]*shard[^}]*\}\}", "2", command)
    command = re.sub(r"\$\{\{[^}]*\}\}", "7", command)
    command = re.sub(r"\$\(\([^)]*\)\)", "2", command)
    command = re.sub(r'"?\$CI_NODE_INDEX/\$CI_NODE_TOTAL"?', "2/4", command)
    command = re.sub(r"\$PG_ARGS", "--pg-bin /usr/lib/postgresql/15/bin", command)
    command = re.sub(r"\$[A-Z_]+", "7", command)
    return shlex.split(command)


@pytest.mark.parametrize(
    "path", [GITHUB, GITLAB, *KUBERNETES], ids=lambda p: str(p.relative_to(CI))
)
def test_fencecheck_commands_parse(path: Path) -> None:
    commands = _commands(path.read_text())
    assert commands, f"no fencecheck command found in {path}"
    parser = build_parser()
    for command in commands:
        argv = _with_sample_values(command)
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{path.name}: `fencecheck {command}` does not parse")
        if args.command == "merge":
            assert args.fail_on == "unknown", "the merge is the gate: nothing unproven passes"


def test_part_counts_agree() -> None:
    github = yaml.safe_load(GITHUB.read_text())
    shards = github["jobs"]["part"]["strategy"]["matrix"]["shard"]
    assert shards == [1, 2, 3, 4]
    assert all("/4" in c for c in _commands(GITHUB.read_text()) if c.startswith("run"))
    parts_job = [d for d in yaml.safe_load_all(KUBERNETES[-1].read_text()) if d["kind"] == "Job"]
    (job,) = parts_job
    completions = job["spec"]["completions"]
    assert all(
        f"/{completions}" in c for c in _commands(KUBERNETES[-1].read_text()) if c.startswith("run")
    )

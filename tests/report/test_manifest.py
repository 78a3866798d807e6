"""MANIFEST.sha256 and `fencecheck verify`: a changed byte, a removed file and
an added file are each found and named; an untouched run verifies."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.cli import main
from harness.evidence import manifest
from harness.evidence.html import write_run_pages


def seal(run: Path) -> str:
    (run / "summary.md").write_text("# fencecheck run\n\n- **run**: x\n\n| a |\n|---|\n")
    write_run_pages(run)
    manifest.write_manifest(run)
    return manifest.run_digest(run)


def verify(run: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["verify", str(run), *extra])
    return code, capsys.readouterr().out


def test_an_untouched_run_verifies(run_pass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digest = seal(run_pass)
    code, out = verify(run_pass, "--digest", digest, capsys=capsys)
    assert code == 0 and "INTACT" in out and digest in out
    assert f"**evidence digest**: {digest}" in (run_pass / "summary.md").read_text()
    assert f'data-evidence-digest="{digest}"' in (run_pass / "index.html").read_text()
    # Views and the seal are as readable as the summary and JUnit files always were.
    umask = os.umask(0)
    os.umask(umask)
    for name in ("summary.md", "index.html", "experiments/B.html", "MANIFEST.sha256"):
        assert (run_pass / name).stat().st_mode & 0o777 == 0o644 & ~umask, name


def test_a_sealed_runs_index_links_its_manifest(run_pass: Path) -> None:
    from harness.evidence.run_report import seal_run

    seal_run(run_pass)
    index = (run_pass / "index.html").read_text()
    assert 'href="MANIFEST.sha256"' in index and (run_pass / "MANIFEST.sha256").is_file()


def test_manifest_is_what_sha256sum_checks(run_pass: Path) -> None:
    seal(run_pass)
    if shutil.which("sha256sum") is None:
        pytest.fail("sha256sum (coreutils) is missing; it is part of every Debian system")
    done = subprocess.run(
        ["sha256sum", "--check", "--strict", "--quiet", "MANIFEST.sha256"],
        cwd=run_pass,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_changed_byte_is_named(run_pass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seal(run_pass)
    archive = run_pass / "archives" / "B.yaml"
    data = bytearray(archive.read_bytes())
    data[100] ^= 0x01
    archive.write_bytes(bytes(data))
    code, out = verify(run_pass, capsys=capsys)
    assert code == 1
    assert "changed: archives/B.yaml" in out
    assert "summary.md records evidence digest" in out  # the digest no longer matches either


def test_a_removed_file_is_named(run_pass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seal(run_pass)
    (run_pass / "logs" / "B" / "A.events.jsonl").unlink()
    code, out = verify(run_pass, capsys=capsys)
    assert code == 1 and "removed: logs/B/A.events.jsonl" in out


def test_an_added_file_is_named(run_pass: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seal(run_pass)
    (run_pass / "archives" / "Z.yaml").write_text("experiment_id: Z\n")
    code, out = verify(run_pass, capsys=capsys)
    assert code == 1 and "added:   archives/Z.yaml" in out


def test_a_page_edited_alone_is_named_but_not_the_digest(
    run_pass: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    digest = seal(run_pass)
    page = run_pass / "experiments" / "B.html"
    page.write_text(page.read_text().replace("PASS", "FAIL"))
    code, out = verify(run_pass, capsys=capsys)
    assert code == 1 and "changed: experiments/B.html" in out
    assert manifest.run_digest(run_pass) == digest  # pages are views, rebuilt by `report`


def test_a_resealed_change_is_caught_by_the_kept_digest(
    run_pass: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = seal(run_pass)
    (run_pass / "logs" / "B" / "B.events.jsonl").write_text("{}\n")
    write_run_pages(run_pass)
    manifest.write_manifest(run_pass)  # someone rewrote the manifest too
    code, _ = verify(run_pass, capsys=capsys)
    assert code == 0, "the folder agrees with itself again"
    code, out = verify(run_pass, "--digest", kept, capsys=capsys)
    assert code == 1 and f"expected evidence digest {kept}" in out


def test_an_unsealed_folder_does_not_verify(
    run_pass: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = verify(run_pass, capsys=capsys)
    assert code == 1 and "never sealed" in out


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(tmp_path / "nope")]) == 64
    assert "is not a directory" in capsys.readouterr().err
    assert main(["verify", str(tmp_path), "--digest", "abc"]) == 64


def test_report_rebuilds_in_place_only_over_sealed_evidence(
    run_pass: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seal(run_pass)
    page = run_pass / "experiments" / "B.html"
    original = page.read_bytes()
    page.write_text("tampered")
    assert main(["report", str(run_pass)]) == 0
    assert page.read_bytes() == original, "rebuilt from the evidence"
    assert verify(run_pass, capsys=capsys)[0] == 0
    (run_pass / "archives" / "B.yaml").write_text("experiment_id: B\n")
    assert main(["report", str(run_pass)]) == 1
    assert "evidence changed" in capsys.readouterr().out
    # Built elsewhere, the pages show the changed archive as what it now is:
    # unreadable (it fails the schema), and the command says so with exit 1.
    out_dir = run_pass.parent / "elsewhere"
    assert main(["report", str(run_pass), "--out", str(out_dir)]) == 1
    assert "1 archive(s) UNREADABLE" in capsys.readouterr().out
    assert "does not match its schema" in (out_dir / "experiments" / "B.html").read_text()


def test_report_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 64
    assert "no archives" in capsys.readouterr().err
    assert main(["report"]) == 64


def test_pages_built_elsewhere_link_to_the_run(run_pass: Path, tmp_path: Path) -> None:
    out = tmp_path / "pages"
    assert main(["report", str(run_pass), "--out", str(out)]) == 0
    index = (out / "index.html").read_text()
    page = (out / "experiments" / "B.html").read_text()
    for html, base in ((index, out), (page, out / "experiments")):
        for href in re.findall(r'href="([^"#]+)"', html):
            assert (base / href).exists(), f"{href} from {base} leads nowhere"
    assert not (run_pass / "index.html").exists(), "the run folder is left untouched"


def _flip(text: str, at: int) -> str:
    """``text`` with the character at ``at`` changed (a hex digit stays one)."""
    char = text[at]
    return text[:at] + ("0" if char != "0" else "1") + text[at + 1 :]


def _in_line(ending: str) -> Callable[[str], int]:
    return lambda text: next(
        i
        for i, line in enumerate(text.splitlines(keepends=True))
        if line.rstrip("\n").endswith(ending)
    )


def _offset(text: str, line: int, column: int) -> int:
    return sum(len(x) for x in text.splitlines(keepends=True)[:line]) + column


MANIFEST_BYTES = {
    "evidence-digest": lambda t: _offset(t, _in_line("  archives/B.yaml")(t), 10),
    "view-digest": lambda t: _offset(t, _in_line("  experiments/B.html")(t), 10),
    "path": lambda t: _offset(t, _in_line("  archives/B.yaml")(t), 64 + 2 + 9),
    "seal-line": lambda t: len(t) - 90,
}


@pytest.mark.parametrize("where", list(MANIFEST_BYTES))
def test_a_changed_byte_in_the_manifest_is_manifest_tampering(
    run_pass: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    seal(run_pass)
    path = run_pass / "MANIFEST.sha256"
    text = path.read_text()
    path.write_text(_flip(text, MANIFEST_BYTES[where](text)))
    code, out = verify(run_pass, capsys=capsys)
    assert code == 1, out
    assert "MANIFEST.sha256 itself was changed after the seal" in out, out
    assert "the files are as sealed, MANIFEST.sha256 is what changed" in out, out
    assert not re.search(r"^  (changed|removed|added): ", out, re.M), out
    # Rebuilding in place would seal over it: refused like changed evidence.
    assert main(["report", str(run_pass)]) == 1


def test_a_manifest_without_its_seal_line_is_still_told_from_the_evidence(
    run_pass: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest written before seal lines: its evidence lines are checked
    against the evidence digest summary.md and index.html record."""
    seal(run_pass)
    path = run_pass / "MANIFEST.sha256"
    lines = path.read_text().splitlines(keepends=True)[:-1]
    text = "".join(lines)
    path.write_text(_flip(text, MANIFEST_BYTES["evidence-digest"](text)))
    code, out = verify(run_pass, capsys=capsys)
    assert code == 1 and "no longer gives the evidence digest" in out, out
    assert "line for archives/B.yaml does not match the file" in out
    assert "changed: archives/B.yaml" not in out


def test_a_changed_file_is_still_a_changed_file(
    run_pass: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seal(run_pass)
    (run_pass / "logs" / "B" / "B.events.jsonl").write_text("{}\n")
    code, out = verify(run_pass, capsys=capsys)
    assert code == 1 and "changed: logs/B/B.events.jsonl" in out
    assert "MANIFEST.sha256 itself" not in out and "is what changed" not in out

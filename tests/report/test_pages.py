"""The pages, read as XML: a row and a page per archive, failing first, the
timeline's lanes and fault spans, B's t0-t3 story, tolerance of odd archives."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from harness.evidence.html import write_run_pages
from harness.evidence.html.facts import Picture, build_picture
from tests.report.conftest import dump, load
from tests.report.expect import expected_fault_spans, expected_lanes


def parse(path: Path) -> ET.Element:
    return ET.fromstring(path.read_text().removeprefix("<!DOCTYPE html>\n"))


def by_attr(root: ET.Element, name: str, value: str | None = None) -> list[ET.Element]:
    return [
        e for e in root.iter() if name in e.attrib and (value is None or e.attrib[name] == value)
    ]


def text_of(e: ET.Element) -> str:
    return "".join(e.itertext())


def test_index_has_a_row_per_archive_failing_first(run_mixed: Path) -> None:
    index = write_run_pages(run_mixed)
    rows = by_attr(parse(index), "data-experiment")
    assert [r.attrib["data-verdict"] for r in rows] == [
        "fail",
        "unknown",
        "unknown",
        "unknown",
        "pass",
    ]
    assert {r.attrib["data-experiment"] for r in rows} == {"B", "B-r1", "B-r2", "C", "D"}
    for label in ("B", "B-r1", "B-r2", "C", "D"):
        assert (run_mixed / "experiments" / f"{label}.html").is_file()
    # The unreadable archives are unknowns with their reason, never dropped,
    # and counted apart.
    d_row = by_attr(parse(index), "data-experiment", "D")[0]
    assert "unreadable: archives/D.yaml" in text_of(d_row)
    assert {r.attrib["data-experiment"] for r in by_attr(parse(index), "data-unreadable")} == {
        "C",
        "D",
    }
    counts = by_attr(parse(index), "class", "counts")[0]
    assert "1 pass, 1 fail, 1 unknown, 2 unreadable of 5" in text_of(counts)


def test_pages_are_self_contained(run_mixed: Path) -> None:
    write_run_pages(run_mixed)
    for page in [run_mixed / "index.html", *(run_mixed / "experiments").glob("*.html")]:
        html = page.read_text()
        assert "<script" not in html and "<link" not in html, page
        assert not re.search(r'(src|href)="(https?:)?//', html), page
        parse(page)  # well-formed
        for href in re.findall(r'href="([^"#]+)"', html):
            assert (page.parent / href).exists(), f"{page.name}: {href} leads nowhere"


def test_pages_are_deterministic(run_pass: Path, tmp_path: Path) -> None:
    write_run_pages(run_pass)
    first = {p.name: p.read_bytes() for p in (run_pass / "experiments").glob("*.html")}
    index = (run_pass / "index.html").read_bytes()
    write_run_pages(run_pass)
    assert {p.name: p.read_bytes() for p in (run_pass / "experiments").glob("*.html")} == first
    assert (run_pass / "index.html").read_bytes() == index


def test_every_lane_and_fault_span_of_each_archive_is_drawn(run_pass: Path, run_fail: Path) -> None:
    for run in (run_pass, run_fail):
        write_run_pages(run)
        for archive_path in (run / "archives").glob("*.yaml"):
            archive = load(archive_path)
            page = parse(run / "experiments" / f"{archive_path.stem}.html")
            lanes = {e.attrib["data-lane"] for e in by_attr(page, "class", "lane")}
            assert lanes == expected_lanes(archive), archive_path.name
            drawn = [e.attrib["data-fault"] for e in by_attr(page, "data-fault")]
            want = expected_fault_spans(archive)
            assert {k: drawn.count(k) for k in want} == want, archive_path.name


def test_b_tells_the_seed_story_t0_to_t3(run_pass: Path) -> None:
    """t0 A gets epoch N; t1 A paused; t2 lease expires, B gets N+1; t3 A resumes, refused."""
    write_run_pages(run_pass)
    page = parse(run_pass / "experiments" / "B.html")
    moments = [text_of(li) for li in by_attr(page, "data-source") if li.tag == "li"]
    story = [
        r"A gets epoch (\d+)",
        r"SIGSTOP A: the kernel reports stopped",
        r"A's lease on epoch \d+ expires by database time",
        r"B gets epoch (\d+)",
        r"SIGCONT A",
        r"A (renew|save_checkpoint|release) rejected: LeaseLost",
    ]
    at = [next(i for i, m in enumerate(moments) if re.search(s, m)) for s in story]
    assert at == sorted(at), moments
    n = int(re.search(story[0], moments[at[0]]).group(1))  # type: ignore[union-attr]
    assert re.search(rf"B gets epoch {n + 1}\b", moments[at[3]])
    # Epoch bars come from the audit trail only, stopped spans from the harness.
    epochs = by_attr(page, "data-kind", "epoch")
    assert [e.attrib["data-owner"] for e in epochs] == ["A", "B"]
    assert {e.attrib["data-source"] for e in epochs} == {"database"}
    assert [e.attrib["data-source"] for e in by_attr(page, "data-fault", "stopped")] == ["harness"]
    rejected = [e for e in by_attr(page, "data-outcome", "fail")]
    assert rejected and {e.attrib["data-source"] for e in rejected} == {"worker"}


def test_a_failing_page_leads_with_the_broken_invariants(run_fail: Path) -> None:
    write_run_pages(run_fail)
    page = parse(run_fail / "experiments" / "B.html")
    body = page.find("body")
    assert body is not None and body.attrib["data-verdict"] == "fail"
    sections = [e for e in body if e.tag in ("section", "h2")]
    assert sections[0].attrib.get("id") == "why", "the broken checks come first"
    broken = [c.attrib["data-check"] for c in by_attr(sections[0], "data-check")]
    archive = load(run_fail / "archives" / "B.yaml")
    assert broken == [c["name"] for c in archive["checks"] if not c["ok"]]


def test_an_unknown_page_leads_with_the_fault_that_did_not_happen(run_mixed: Path) -> None:
    write_run_pages(run_mixed)
    page = parse(run_mixed / "experiments" / "B-r2.html")
    why = by_attr(page, "id", "why")[0]
    assert "unknown" in why.attrib["class"]
    assert "fault not confirmed" in text_of(why)


def test_an_archive_with_fields_the_schema_does_not_know_is_unreadable(run_mixed: Path) -> None:
    """A newer format (fields this version's published schema does not know, a
    failing check among them) is not read as this version's archive: its page
    names what does not match and shows nothing of its content, no verdict."""
    write_run_pages(run_mixed)
    page = parse(run_mixed / "experiments" / "C.html")
    assert by_attr(page, "data-verdict")[0].attrib["data-verdict"] == "unknown"
    why = by_attr(page, "id", "why")[0]
    assert "unexpected field(s) worker_metrics" in text_of(why)
    assert "global_invariants" in text_of(why)
    assert "A/1, B/2" not in "".join(page.itertext())
    assert not by_attr(page, "class", "timeline")


def test_fields_without_a_view_of_their_own_are_shown_raw(run_pass: Path) -> None:
    archive = load(run_pass / "archives" / "B.yaml")
    archive["phases_s"] = {"scenario": 1.5, "teardown": 0.25}
    dump(run_pass / "archives" / "B.yaml", archive)
    write_run_pages(run_pass)
    page = parse(run_pass / "experiments" / "B.html")
    raw = {e.attrib["data-field"] for e in by_attr(page, "class", "raw")}
    assert "phases_s" in raw and "teardown" in text_of(by_attr(page, "data-field", "phases_s")[0])


def test_h_shows_the_failover_and_the_replication_mode(run_pass: Path) -> None:
    write_run_pages(run_pass)
    page = parse(run_pass / "experiments" / "H-sync_cancelled_wait.html")
    failover = by_attr(page, "data-kind", "failover")
    assert len(failover) == 2  # fenced, promoted
    assert any("sync" in text_of(f) and "lag" in text_of(f) for f in failover)
    assert by_attr(page, "data-fault", "link"), "the replication link cut is drawn"


def test_worker_accounts_never_draw_epochs() -> None:
    archive = load(Path(__file__).parent / "fixtures" / "run-pass" / "archives" / "B.yaml")
    archive["audit_trail"] = []
    picture = build_picture(archive)
    assert not [s for s in picture.spans if s.kind == "epoch"]
    assert any(m.source == "worker" and m.label.startswith("claim e") for m in picture.marks)


@pytest.mark.slow
def test_a_large_run_is_built_the_same_by_a_process_pool(
    run_pass: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import harness.evidence.html as html

    source = (run_pass / "archives" / "B.yaml").read_bytes()
    for n in range(1, html.PARALLEL_FROM + 2):
        (run_pass / "archives" / f"B-r{n}.yaml").write_bytes(source)
    pooled, serial = tmp_path / "pooled", tmp_path / "serial"
    before = {c.pid for c in psutil.Process().children()}
    write_run_pages(run_pass, pooled)
    # The pool leaves nothing running, its resource tracker included: a run
    # that wrote pages must not leave a process behind when it exits.
    after = [c for c in psutil.Process().children() if c.pid not in before]
    assert [(c.pid, c.cmdline()) for c in after if c.status() != psutil.STATUS_ZOMBIE] == []
    monkeypatch.setattr(html, "PARALLEL_FROM", 10_000)
    write_run_pages(run_pass, serial)
    for page in sorted(serial.rglob("*.html")):
        assert (pooled / page.relative_to(serial)).read_bytes() == page.read_bytes(), page.name


def test_an_audit_trail_of_old_and_new_rows_draws_the_same_epochs() -> None:
    """The audit trail may grow to every protocol table, each change as old/new rows."""
    archive = load(Path(__file__).parent / "fixtures" / "run-pass" / "archives" / "B.yaml")
    flat = build_picture(archive)
    nested = []
    for row in archive["audit_trail"]:
        new = {k: v for k, v in row.items() if not k.startswith("old_")}
        old = {k[4:]: v for k, v in row.items() if k.startswith("old_")}
        common = {k: new.pop(k) for k in ("seq", "at", "txid", "app", "op")}
        nested.append({**common, "table": "agent_runs", "new": new, "old": old})
    nested.append(
        {
            "seq": 99,
            "at": nested[-1]["at"],
            "app": "B",
            "op": "INSERT",
            "table": "outbox",
            "new": {"event_id": "e1"},
            "old": None,
        }
    )
    picture = build_picture({**archive, "audit_trail": nested})

    def epochs(p: Picture) -> list[tuple[str, float]]:
        return [(s.label, s.start) for s in p.spans if s.kind == "epoch"]

    assert epochs(picture) == epochs(flat) and len(epochs(flat)) == 2
    assert [m.label for m in picture.marks if m.row == "other tables"] == ["outbox insert"]


def test_control_characters_keep_the_page_well_formed(run_pass: Path) -> None:
    archive = load(run_pass / "archives" / "B.yaml")
    archive["observed_result"] = "torn line \x00\x07 from a killed worker"
    archive["worker_stdout_tail"] = ["\x1b[31mred\x1b[0m"]
    dump(run_pass / "archives" / "B.yaml", archive)
    write_run_pages(run_pass)
    parse(run_pass / "experiments" / "B.html")

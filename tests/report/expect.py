"""What a page must show for an archive, computed here from the archive
itself (independently of the page builder), so the tests can compare."""

from __future__ import annotations

from typing import Any


def expected_lanes(archive: dict[str, Any]) -> set[str]:
    workers = {str(e["worker"]) for e in archive.get("history") or [] if "worker" in e}
    workers |= {str(h["worker"]) for h in archive.get("control_hits") or []}
    workers |= {str(s["process"]).removeprefix("worker-") for s in archive.get("signals") or []}
    return {"harness", "database", "tool"} | {f"worker:{w}" for w in workers}


def expected_fault_spans(archive: dict[str, Any]) -> dict[str, int]:
    signals = archive.get("signals") or []
    hits = archive.get("control_hits") or []
    crashes = sum(h.get("action") == "crash" or h.get("released_with") == "crash" for h in hits)
    return {
        "stopped": sum(s.get("signal") == "SIGSTOP" for s in signals),
        "killed": sum(s.get("signal") == "SIGKILL" for s in signals) + crashes,
        "link": len(archive.get("faults") or []),
    }

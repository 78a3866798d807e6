"""The pages: one index per run and one page per experiment run, static and
self-contained (inline CSS and SVG, no script, no network), opened from disk.

Invariants:
- Built from the run directory's files alone (see ``harness.evidence.run_dir``); the same files
  give the same bytes (no build time in a page), so a rebuild can be compared.
- Every archive gets a row on the index and a page, readable or not; a page
  leads with what broke when its verdict is not pass. An archive that cannot
  be read or fails the published schema is *unreadable*: its page and row
  say why, nothing of its content is shown, and the index counts it apart.
- Links are relative, so the directory can be moved or copied as a whole.
- Archive fields this module does not know are shown, never dropped: each in
  a collapsible raw section; missing optional fields are simply not shown.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.evidence import bounded_read
from harness.evidence.archive import atomic_write_text, fencecheck_version
from harness.evidence.html.facts import FAULT_KINDS, SOURCE_TEXT, build_picture, counts, mapping
from harness.evidence.html.markup import (
    Markup,
    Node,
    attrs,
    details,
    el,
    escape_text,
    kv_table,
    render,
    text,
    thead,
)
from harness.evidence.html.style import CSS
from harness.evidence.html.svg import timeline_svg
from harness.evidence.manifest import READABLE
from harness.evidence.run_dir import (
    ARCHIVES,
    PAGES,
    Entry,
    entry_of,
    log_files,
    observed_faults,
    run_facts,
)
from harness.evidence.yaml_emit import emit_yaml
from harness.verdict import Verdict

GLYPH = {Verdict.PASS: "✓", Verdict.FAIL: "✗", Verdict.UNKNOWN: "?", Verdict.NOT_APPLICABLE: "-"}
ORDER = {Verdict.FAIL: 0, Verdict.UNKNOWN: 1, Verdict.PASS: 2, Verdict.NOT_APPLICABLE: 3}
MAX_ROWS = 300
PASS_ROWS_OPEN = 60
# Fields the experiment page shows in their own sections; anything else in
# an archive goes to "Other recorded fields".
KNOWN = frozenset(
    {
        "archive_version", "experiment_id", "title", "seed_section", "variant", "git_commit",
        "runtime_versions", "postgres_version", "postgres_settings", "deployment", "worker",
        "run_id", "tenant_id", "lease_duration", "heartbeat_interval", "fault_injection_point",
        "commands_executed", "worker_logs_path", "postgres_queries_and_results",
        "mock_tool_request_log", "mock_tool_resources", "broker_messages", "expected_invariant",
        "observed_result", "pass_or_fail", "verdict_reason", "checks", "faults", "control_hits",
        "history", "signals", "audit_trail", "timeline", "failover", "seed", "repeat_index",
        "started_at", "finished_at", "duration_s", "natural_wait_s", "harness_error",
        "fencecheck_version", "injected_fault",
    }
)  # fmt: skip


def verdict_badge(verdict: Verdict) -> Markup:
    return el(
        "span",
        f"{GLYPH[verdict]} {verdict.words.upper()}",
        class_=f"verdict verdict-{verdict.value}",
        data_verdict=verdict.value,
        title={
            Verdict.PASS: "pass: every invariant held and every fault took effect",
            Verdict.FAIL: "fail: an invariant broke (with every fault confirmed)",
            Verdict.UNKNOWN: "unknown: proved nothing either way (a fault did not take effect, "
            "or the harness could not decide)",
            Verdict.NOT_APPLICABLE: "not applicable: the system declares it lacks a capability "
            "or injection point this experiment needs; not run",
        }[verdict],
    )


def page(title: str, *body: Node, **attributes: Any) -> str:
    head = el(
        "head",
        el("meta", charset="utf-8"),
        el("meta", name="viewport", content="width=device-width, initial-scale=1"),
        # Nothing may load from anywhere: the page is evidence, opened offline.
        el(
            "meta",
            http_equiv="Content-Security-Policy",
            content="default-src 'none'; style-src 'unsafe-inline'; img-src data:",
        ),
        el("title", title),
        el("style", Markup(CSS)),
    )
    return "<!DOCTYPE html>\n" + el("html", head, el("body", *body, **attributes), lang="en") + "\n"


def rel(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target, start)).as_posix()


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# ------------------------------------------------------------- generic
# Evidence values are most of a page (tens of thousands of cells), so they are
# written straight into one list of strings: no el() call, Markup or join per
# cell, and no escaping of text that needs none. The output is exactly what the
# el()/kv_table()/table() composition gives; _value_generic keeps that
# composition for what the fast paths do not take (Mapping and list
# subclasses, other types, depth 3 and over), so unusual values render as they
# always did.
_NULL = '<span class="muted">null</span>'
_EMPTY_MAP = '<span class="muted">{}</span>'
_EMPTY_LIST = '<span class="muted">none</span>'
# Exact scalar types whose str() never holds a character to escape.
_PLAIN = frozenset({int, float, bool})


def value_html(value: Any, depth: int = 0) -> Markup:
    """Any archive value, readably: mappings as key/value tables, lists of
    mappings as tables (the first MAX_ROWS rows), deep nesting as YAML."""
    out: list[str] = []
    _value(value, depth, out)
    return Markup("".join(out))


def _value(value: Any, depth: int, out: list[str]) -> None:
    """Append ``value_html(value, depth)`` to ``out``."""
    kind = type(value)
    if kind is str:
        if "\n" in value or len(value) > 300:
            out += ("<pre>", escape_text(value), "</pre>")
        else:
            out.append(escape_text(value))
    elif value is None:
        out.append(_NULL)
    elif kind in _PLAIN:
        out.append(str(value))
    elif kind is dict and depth < 3:
        if not value:
            out.append(_EMPTY_MAP)
            return
        out.append('<table class="kv"><tbody>')
        for k, v in value.items():
            out += ("<tr><th>", escape_text(str(k)), "</th><td>")
            _value(v, depth + 1, out)
            out.append("</td></tr>")
        out.append("</tbody></table>")
    elif kind is list and depth < 3:
        if not value:
            out.append(_EMPTY_LIST)
        elif all(isinstance(v, Mapping) for v in value):
            _rows(value, depth, "", out)
        elif all(not isinstance(v, Mapping | list) for v in value):
            out.append("<ul>")
            for v in value[:MAX_ROWS]:
                out.append("<li>")
                _value(v, depth + 1, out)
                out.append("</li>")
            out += ("</ul>", _more(value))
        else:
            out += ("<pre>", escape_text(emit_yaml(value)), "</pre>")
    else:
        out.append(_value_generic(value, depth))


def _value_generic(value: Any, depth: int) -> Markup:
    """value_html by element composition, for what _value has no fast path for."""
    if value is None:
        return el("span", "null", class_="muted")
    if isinstance(value, bool | int | float):
        return text(value)
    if isinstance(value, str):
        return el("pre", value) if "\n" in value or len(value) > 300 else text(value)
    if depth >= 3:
        return el("pre", emit_yaml(value))
    if isinstance(value, Mapping):
        if not value:
            return el("span", "{}", class_="muted")
        return kv_table((str(k), value_html(v, depth + 1)) for k, v in value.items())
    if isinstance(value, list):
        if not value:
            return el("span", "none", class_="muted")
        if all(isinstance(v, Mapping) for v in value):
            return rows_table(value, depth)
        if all(not isinstance(v, Mapping | list) for v in value):
            items = el("ul", [el("li", value_html(v, depth + 1)) for v in value[:MAX_ROWS]])
            return render([items, _more(value)])
        return el("pre", emit_yaml(value))
    return text(repr(value))


def rows_table(rows: Sequence[Mapping[str, Any]], depth: int = 0, **attributes: Any) -> Markup:
    out: list[str] = []
    _rows(rows, depth, attrs(attributes), out)
    return Markup("".join(out))


def _rows(rows: Sequence[Mapping[str, Any]], depth: int, attributes: str, out: list[str]) -> None:
    """Append a table of ``rows`` (a column per key, in first-seen order) to ``out``."""
    shown = rows[:MAX_ROWS]
    # A dict keeps first-seen order and finds a name at once (a list was
    # searched per key per row).
    columns: dict[str, None] = {}
    for r in shown:
        for k in r:
            columns.setdefault(k if type(k) is str else str(k))
    out.append(f"<table{attributes}><thead><tr>")
    out += [f"<th>{escape_text(c)}</th>" for c in columns]
    out.append("</tr></thead><tbody>")
    for r in shown:
        out.append("<tr>")
        get = r.get
        for c in columns:
            out.append("<td>")
            _value(get(c), depth + 1, out)
            out.append("</td>")
        out.append("</tr>")
    out += ("</tbody></table>", _more(rows))


def _more(rows: Sequence[Any]) -> Markup:
    if len(rows) <= MAX_ROWS:
        return Markup("")
    return el(
        "p",
        f"… and {len(rows) - MAX_ROWS} more rows: the archive holds all {len(rows)}.",
        class_="note",
    )


# ------------------------------------------------------------- experiment page
def _check_card(check: Mapping[str, Any]) -> Markup:
    extra = {
        k: v for k, v in check.items() if k not in ("name", "kind", "ok", "expected", "observed")
    }
    kind = str(check.get("kind", "?"))
    heading = {
        "fault": "fault not confirmed",
        "progress": "progress not made"
        + (" (excused by timing)" if check.get("excused_by") else ""),
    }.get(kind, "invariant broken")
    return el(
        "div",
        el("h3", f"{heading}: {check.get('name')}"),
        kv_table(
            [
                ("expected", value_html(check.get("expected"))),
                ("observed", value_html(check.get("observed"))),
                *((str(k), value_html(v)) for k, v in extra.items()),
            ]
        ),
        class_=f"check {kind if kind in ('fault', 'progress') else 'invariant'}",
        data_check=str(check.get("name")),
    )


def _unknown_failures(archive: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """Entries of fields this page does not know that say they do not hold
    (``ok``/``holds`` false, ``violated`` true): a newer checker's results."""
    found = []
    for key, value in archive.items():
        if key in KNOWN or not isinstance(value, list):
            continue
        for item in value:
            if isinstance(item, Mapping) and (
                item.get("ok") is False
                or item.get("holds") is False
                or item.get("violated") is True
            ):
                found.append((key, item))
    return found


def broken_section(archive: Mapping[str, Any], verdict: Verdict) -> Markup:
    """What keeps a run from passing, first on its page: the broken invariants
    (fail) or the faults that did not take effect (unknown), with their rows."""
    if verdict is Verdict.PASS:
        return Markup("")
    if verdict is Verdict.NOT_APPLICABLE:
        return el(
            "div",
            el("h2", "Why this is not applicable: the system declares it lacks what it needs"),
            el("p", el("strong", str(archive.get("verdict_reason") or "no reason recorded"))),
            el(
                "p",
                "Not run: the system under test says so itself in its mapping "
                "(docs/worker-contract.md section 14). Nothing about it is proven here either way.",
                class_="note",
            ),
            class_="broken unknown",
        )
    checks = [c for c in archive.get("checks") or [] if isinstance(c, Mapping)]
    invariants = [c for c in checks if c.get("ok") is False and c.get("kind") != "fault"]
    faults = [c for c in checks if c.get("ok") is False and c.get("kind") == "fault"]
    others = _unknown_failures(archive)
    first, second = (invariants, faults) if verdict is Verdict.FAIL else (faults, invariants)
    parts: list[Markup] = [
        el(
            "h2",
            "Why this is a fail: the invariant that broke"
            if verdict is Verdict.FAIL
            else "Why this is unknown: it proved nothing either way",
        ),
        el("p", el("strong", str(archive.get("verdict_reason") or "no reason recorded"))),
    ]
    parts += [_check_card(c) for c in first]
    for key, item in others:
        parts.append(
            el(
                "div",
                el("h3", f"{key}: {item.get('name') or item.get('invariant') or 'does not hold'}"),
                value_html(dict(item)),
                class_="check invariant",
                data_check=f"{key}:{item.get('name', '')}",
            )
        )
    parts += [_check_card(c) for c in second]
    if not first and not others:
        parts.append(
            el(
                "p",
                "No check of the archive is marked broken; the reason above is all it says.",
                class_="note",
            )
        )
    if (
        not any(
            isinstance(v, list | Mapping)
            for c in first
            for k, v in c.items()
            if k not in ("expected", "observed")
        )
        and not others
    ):
        parts.append(
            el(
                "p",
                "These checks attach no rows of their own; the rows they judged are in the "
                "evidence below: ",
                el("a", "audit trail", href="#audit"),
                ", ",
                el("a", "queries and rows", href="#queries"),
                ", ",
                el("a", "tool log", href="#tool"),
                ".",
                class_="note",
            )
        )
    if archive.get("harness_error"):
        parts.append(
            details(
                "harness error (traceback)", el("pre", str(archive["harness_error"])), open_=True
            )
        )
    return el("section", *parts, class_=f"broken {verdict.value}", id="why")


def _summary_table(archive: Mapping[str, Any], entry: Entry) -> Markup:
    worker = mapping(archive.get("worker"))
    rows: list[tuple[str, Any]] = [
        ("invariant (must hold)", entry.invariant),
        (
            "fault (as the experiment states it)",
            archive.get("injected_fault") or "not recorded in this archive",
        ),
        (
            "faults the harness recorded",
            "; ".join(observed_faults(archive)) or "none (a fault by barrier or query only)",
        ),
        ("injection point", archive.get("fault_injection_point") or "-"),
        ("source in the seeds", archive.get("seed_section")),
        (
            "lease / heartbeat",
            f"{archive.get('lease_duration')} / {archive.get('heartbeat_interval')}",
        ),
        ("run id(s)", archive.get("run_id")),
        ("tenant", archive.get("tenant_id")),
        ("worker", f"{worker.get('command')}"),
        ("worker digest", worker.get("digest")),
        ("mutant", worker.get("mutant") or "none"),
        ("PostgreSQL", archive.get("postgres_version")),
        ("deployment", archive.get("deployment")),
        ("seed / repetition", f"{archive.get('seed')} / {archive.get('repeat_index', 0)}"),
        ("started / finished", f"{archive.get('started_at')} / {archive.get('finished_at')}"),
        (
            "wall / natural wait",
            f"{seconds(entry.duration_s)} s / {seconds(entry.natural_wait_s)} s",
        ),
        ("git commit", archive.get("git_commit")),
        ("fencecheck version", archive.get("fencecheck_version") or "not recorded in this archive"),
    ]
    return kv_table(((k, value_html(v)) for k, v in rows), class_="kv facts")


def _checks_table(archive: Mapping[str, Any]) -> Markup:
    checks = [c for c in archive.get("checks") or [] if isinstance(c, Mapping)]
    if not checks:
        return el("p", "No check was recorded.", class_="note")
    rows = []
    for c in checks:
        ok = c.get("ok") is True
        mark = el("span", "✓ held" if ok else "✗ NOT", class_="ok-yes" if ok else "ok-no")
        if c.get("kind") == "not_judged":
            mark = el("span", "not judged", class_="ok-none")
        rows.append(
            el(
                "tr",
                el("td", mark),
                el("td", str(c.get("kind"))),
                el("td", str(c.get("name"))),
                el("td", value_html(c.get("expected"))),
                el("td", value_html(c.get("observed"))),
                class_="check-row",
                data_ok="true" if ok else "false",
                data_kind=str(c.get("kind")),
            )
        )
    head = thead(("", "kind", "check", "expected", "observed"))
    return el("table", head, el("tbody", rows), class_="checks")


def _moments_list(archive: Mapping[str, Any]) -> tuple[Markup, Markup]:
    picture = build_picture(archive)
    label = str(archive.get("experiment_id", "?")) + (
        f"[{archive['variant']}]" if archive.get("variant") else ""
    )
    svg = timeline_svg(picture, f"timeline of {label}: {archive.get('title', '')}")
    items = [
        el(
            "li",
            el("span", m.source, class_=f"src src-{m.source}", title=SOURCE_TEXT[m.source]),
            el("span", picture.rel(m.at), class_="mono"),
            " ",
            m.text,
            data_source=m.source,
        )
        for m in picture.moments
    ]
    spans = counts(picture.spans)
    faults = ", ".join(f"{n} {k}" for k, n in spans.items() if n) or "none"
    lanes = ", ".join(lane.title for lane in picture.lanes)
    caption = el(
        "p",
        f"Lanes: {lanes}. Fault spans drawn: {faults}. Hover a shape for the full fact and its source.",
        class_="note",
        data_fault_spans=",".join(f"{k}={spans[k]}" for k in FAULT_KINDS),
    )
    moments = (
        el("ol", items, class_="moments")
        if items
        else el(
            "p",
            "No key moment (no epoch grant, signal, link fault, held barrier or rejection).",
            class_="note",
        )
    )
    return render([svg, caption]), moments


def _evidence(archive: Mapping[str, Any]) -> Markup:
    out: list[Markup] = []

    def section(key: str, title: str, body: Markup, anchor: str | None = None) -> None:
        value = archive.get(key)
        n = len(value) if isinstance(value, list) else None
        label = f"{title} ({n})" if n is not None else title
        out.append(details(label, body, id=anchor, data_field=key))

    audit = archive.get("audit_trail")
    section(
        "audit_trail",
        "Audit trail: every change of agent_runs, recorded by the harness's trigger",
        rows_table(audit)
        if isinstance(audit, list) and audit
        else el("p", "none recorded", class_="note"),
        "audit",
    )
    queries = [
        q for q in archive.get("postgres_queries_and_results") or [] if isinstance(q, Mapping)
    ]
    section(
        "postgres_queries_and_results",
        "Queries the harness ran as superuser, with their rows",
        render(
            [
                details(
                    f"{q.get('label')} ({len(q.get('rows') or [])} rows)",
                    el("pre", str(q.get("query"))),
                    el("p", f"parameters: {q.get('params')}", class_="note")
                    if q.get("params")
                    else None,
                    value_html(q.get("rows")),
                )
                for q in queries
            ]
        )
        or el("p", "none", class_="note"),
        "queries",
    )
    for key, title, anchor in (
        ("mock_tool_request_log", "Mock tool: requests from its own log", "tool"),
        ("mock_tool_resources", "Mock tool: resources it created", None),
        ("broker_messages", "Broker messages", None),
        ("failover", "Failover record (H)", "failover"),
        ("signals", "Signals the harness sent, with the kernel state it confirmed", None),
        ("faults", "Link faults (toxiproxy journal)", None),
        ("control_hits", "Injection points reached and how the harness answered", None),
        ("commands_executed", "Commands the harness executed", None),
        ("history", "Worker histories (their own account, merged by time)", None),
    ):
        if key in archive:
            section(key, title, value_html(archive.get(key)), anchor)
    if archive.get("timeline"):
        section(
            "timeline",
            "Timeline as text (* = observed by the harness)",
            el("pre", "\n".join(str(line) for line in archive["timeline"])),
        )
    for key, title in (
        ("postgres_settings", "PostgreSQL settings read at the end"),
        ("runtime_versions", "Runtime versions"),
        ("observed_result", "Observed result (all checks, as one text)"),
    ):
        if key in archive:
            section(key, title, value_html(archive.get(key)))
    return render(out)


def _other_fields(archive: Mapping[str, Any]) -> Markup:
    unknown = [k for k in archive if k not in KNOWN]
    if not unknown:
        return Markup("")
    return el(
        "section",
        el("h2", "Other recorded fields"),
        el("p", "Fields this page has no special view for, shown as recorded.", class_="note"),
        [details(k, value_html(archive[k]), data_field=k, class_="raw") for k in unknown],
        id="other",
    )


def _logs(report_dir: Path, label: str, here: Path) -> Markup:
    files = log_files(report_dir, label)
    if not files:
        return el("p", "No log files in logs/" + label + "/.", class_="note")
    return el(
        "ul",
        [
            el(
                "li",
                el("a", f.relative_to(report_dir).as_posix(), href=rel(f, here)),
                f" ({f.stat().st_size} bytes)",
            )
            for f in files
        ],
    )


def experiment_page(
    report_dir: Path,
    label: str,
    archive: Mapping[str, Any] | None,
    problem: str | None,
    out_dir: Path,
) -> Entry:
    """Write ``out_dir/experiments/<label>.html``; returns the archive's index line."""
    entry = entry_of(label, archive, problem)
    here = out_dir / PAGES
    here.mkdir(parents=True, exist_ok=True)
    archive_file = report_dir / ARCHIVES / f"{label}.yaml"
    nav = el(
        "nav",
        el("a", "← run index", href=rel(out_dir / "index.html", here)),
        el("a", f"archive {ARCHIVES}/{label}.yaml", href=rel(archive_file, here)),
        el("a", "JUnit", href=rel(report_dir / "junit.xml", here))
        if (report_dir / "junit.xml").is_file()
        else None,
        el("a", "logs", href="#logs"),
        el("a", "timeline", href="#timeline"),
        el("a", "checks", href="#checks"),
        el("a", "evidence", href="#evidence"),
    )
    title = f"{entry.name} {entry.title}".strip()
    head = el("h1", verdict_badge(entry.verdict), title)
    reason = el("p", el("strong", "verdict reason: "), entry.reason or "-")
    if archive is None:
        body = [
            nav,
            head,
            el(
                "section",
                el("h2", "This archive is unreadable"),
                el("pre", problem or "unknown problem"),
                el(
                    "p",
                    "It cannot be read, or it does not match the published schema "
                    "(harness/evidence/schemas/evidence-archive.schema.json): no verdict and "
                    "nothing on this page is built from its content. Its verdict counts as "
                    "unknown.",
                    class_="note",
                ),
                class_="broken unknown",
                id="why",
            ),
            el("h2", "Logs", id="logs"),
            _logs(report_dir, label, here),
        ]
    else:
        svg, moments = _moments_list(archive)
        body = [
            nav,
            head,
            reason,
            broken_section(archive, entry.verdict),
            el("h2", "What was tested"),
            _summary_table(archive, entry),
            el("h2", "Timeline", id="timeline"),
            svg,
            el("h3", "Key moments"),
            moments,
            el("h2", "Checks: expected and observed", id="checks"),
            _checks_table(archive),
            el("h2", "Evidence", id="evidence"),
            el("p", "Everything the archive holds; each section opens on a click.", class_="note"),
            _evidence(archive),
            _other_fields(archive),
            el("h2", "Logs", id="logs"),
            _logs(report_dir, label, here),
        ]
    body.append(
        el(
            "footer",
            el(
                "p",
                f"Built from {ARCHIVES}/{label}.yaml by fencecheck {fencecheck_version()}; "
                "`fencecheck report` rebuilds it from the run directory.",
                class_="note",
            ),
        )
    )
    atomic_write_text(
        here / f"{label}.html",
        page(
            f"{entry.verdict.words.upper()} {title} · fencecheck",
            *body,
            data_verdict=entry.verdict.value,
            data_label=label,
        ),
        mode=READABLE,
    )
    return entry


# ------------------------------------------------------------- index
@dataclass(frozen=True)
class IndexLinks:
    """Where an index row's links go: its pages, and the run's evidence (which
    is elsewhere when the pages are built with --out)."""

    pages: str
    evidence: str
    junit: bool

    def to(self, rel_path: str) -> str:
        return f"{self.evidence}{rel_path}"


def _row(e: Entry, links: IndexLinks) -> Markup:
    link = f"{links.pages}/{e.label}.html"
    broken = (
        el("ul", [el("li", b) for b in e.broken[:5]], class_="note")
        if e.broken and e.verdict is not Verdict.PASS
        else None
    )
    return el(
        "tr",
        el("td", verdict_badge(e.verdict)),
        el("td", el("a", e.name, href=link)),
        el("td", e.layer or "-"),
        el("td", e.title),
        el("td", e.invariant),
        el("td", e.fault),
        el("td", seconds(e.duration_s), class_="num"),
        el("td", seconds(e.natural_wait_s), class_="num"),
        el("td", e.reason, broken),
        el(
            "td",
            el("a", "page", href=link),
            " · ",
            el("a", "archive", href=links.to(f"{ARCHIVES}/{e.label}.yaml")),
            " · ",
            el("a", "logs", href=f"{link}#logs"),
            render([" · ", el("a", "JUnit", href=links.to("junit.xml"))]) if links.junit else None,
        ),
        class_=f"row-{e.verdict.value}",
        data_experiment=e.label,
        data_verdict=e.verdict.value,
        data_unreadable="true" if e.problem is not None else None,
    )


HEADERS = (
    "verdict",
    "experiment",
    "layer",
    "title",
    "invariant",
    "fault",
    "wall s",
    "natural wait s",
    "reason",
    "evidence",
)


def _experiments(entries: Sequence[Entry], links: IndexLinks) -> Markup:
    ranked = sorted(entries, key=lambda e: ORDER[e.verdict])  # stable: run order within
    attention = [e for e in ranked if e.verdict in (Verdict.FAIL, Verdict.UNKNOWN)]
    passed = [e for e in ranked if e.verdict is Verdict.PASS]
    apart = [e for e in ranked if e.verdict is Verdict.NOT_APPLICABLE]
    head = thead(HEADERS)
    out: list[Markup] = []
    if attention:
        out.append(el("h2", f"Not passed ({len(attention)}): failures first"))
        out.append(
            el(
                "table",
                head,
                el("tbody", [_row(e, links) for e in attention]),
                class_="experiments",
            )
        )
    if passed:
        rows = el(
            "table", head, el("tbody", [_row(e, links) for e in passed]), class_="experiments"
        )
        title = f"Passed ({len(passed)})"
        out.append(el("h2", title) if len(passed) <= PASS_ROWS_OPEN else Markup(""))
        out.append(rows if len(passed) <= PASS_ROWS_OPEN else details(f"{title}: show them", rows))
    if apart:
        # Apart from the judged: the system declared it lacks what they need.
        out.append(
            el("h2", f"Not applicable ({len(apart)}): the system declares it lacks what these need")
        )
        out.append(
            el("table", head, el("tbody", [_row(e, links) for e in apart]), class_="experiments")
        )
    return render(out)


def _rollup(entries: Sequence[Entry], pages: str) -> Markup:
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.group, []).append(e)
    if all(len(g) == 1 for g in groups.values()):
        return Markup("")
    rows = []
    for name, group in groups.items():
        c = {v: sum(e.verdict is v for e in group) for v in Verdict}
        walls = [e.duration_s for e in group if e.duration_s is not None]
        strip = el(
            "div",
            [
                el(
                    "a",
                    GLYPH[e.verdict],
                    href=f"{pages}/{e.label}.html",
                    class_=f"cell-{e.verdict.value}",
                    title=f"{e.name}: {e.verdict.words}",
                )
                for e in sorted(group, key=lambda e: e.repeat_index)
            ],
            class_="strip",
        )
        rows.append(
            el(
                "tr",
                el("td", verdict_badge(Verdict.merge(e.verdict for e in group))),
                el("td", name),
                el("td", group[0].title),
                el("td", str(len(group)), class_="num"),
                el(
                    "td",
                    f"{c[Verdict.PASS]} / {c[Verdict.FAIL]} / {c[Verdict.UNKNOWN]} / "
                    f"{c[Verdict.NOT_APPLICABLE]}",
                    class_="num",
                ),
                el("td", f"{min(walls):.2f} to {max(walls):.2f}" if walls else "-", class_="num"),
                el("td", strip),
                data_group=name,
            )
        )
    head = thead(
        (
            "overall",
            "experiment",
            "title",
            "runs",
            "pass / fail / unknown / not applicable",
            "wall s (min to max)",
            "each repetition",
        )
    )
    return render(
        [
            el("h2", "Per experiment, over all repetitions"),
            el("table", head, el("tbody", rows), class_="rollup"),
        ]
    )


def _facts_table(
    report_dir: Path, entries: Sequence[Entry], digest: str, here: Path, *, sealed: bool = False
) -> Markup:
    facts = run_facts(list(entries))
    started = sorted(e.started_at for e in entries if e.started_at)
    finished = sorted(e.finished_at for e in entries if e.finished_at)
    rows: list[Markup] = []
    for name, values in facts.items():
        shown: Markup = (
            text(values[0]) if len(values) == 1 else el("ul", [el("li", v) for v in values])
        )
        note = (
            el("span", f" ({len(values)} different values across the archives)", class_="ok-no")
            if len(values) > 1
            else None
        )
        rows.append(el("tr", el("th", name), el("td", shown, note), data_fact=name))
    if started:
        rows.append(
            el(
                "tr",
                el("th", "date"),
                el("td", f"{started[0]} → {finished[-1] if finished else '?'}"),
            )
        )
    walls = [e.duration_s for e in entries if e.duration_s is not None]
    rows.append(
        el(
            "tr",
            el("th", "experiment runs"),
            el("td", f"{len(entries)} (sum of wall times {sum(walls):.1f} s)"),
        )
    )
    files = [
        el("a", name, href=rel(report_dir / name, here))
        for name in ("summary.md", "junit.xml", "results.json", "MANIFEST.sha256", "mutants.json")
        # The seal is written right after the pages: linked before it exists.
        if (report_dir / name).is_file() or (sealed and name == "MANIFEST.sha256")
    ]
    rows.append(
        el(
            "tr",
            el("th", "files"),
            el("td", [render([f, " "]) for f in files]) if files else el("td", "-"),
        )
    )
    rows.append(
        el(
            "tr",
            el("th", "evidence digest"),
            el(
                "td",
                el("span", digest, class_="digest"),
                el(
                    "p",
                    "sha256 over MANIFEST.sha256's lines for every file but summary.md and the "
                    "pages. Keep it outside this folder; `fencecheck verify DIR --digest <it>` "
                    "proves later that no evidence changed.",
                    class_="note",
                ),
            ),
        )
    )
    return el("table", el("tbody", rows), class_="kv facts")


def index_page(
    report_dir: Path,
    entries: Sequence[Entry],
    digest: str,
    out_dir: Path,
    *,
    title: str | None = None,
    sealed: bool = False,
) -> Path:
    """Write ``out_dir/index.html`` for the run in ``report_dir`` (``sealed``: the
    caller writes MANIFEST.sha256 next)."""
    pages = rel(out_dir / PAGES, out_dir)
    evidence = "" if report_dir.resolve() == out_dir.resolve() else rel(report_dir, out_dir) + "/"
    links = IndexLinks(pages, evidence, (report_dir / "junit.xml").is_file())
    verdict = Verdict.merge(e.verdict for e in entries)
    unreadable = [e for e in entries if e.problem is not None]
    n = {v: sum(e.verdict is v and e.problem is None for e in entries) for v in Verdict}
    name = title or f"fencecheck run {report_dir.resolve().name}"
    mutants = [m for m in run_facts(list(entries)).get("mutant", []) if m != "none"]
    body = [
        el("h1", verdict_badge(verdict), name),
        el(
            "p",
            f"{n[Verdict.PASS]} pass, {n[Verdict.FAIL]} fail, {n[Verdict.UNKNOWN]} unknown",
            f", {n[Verdict.NOT_APPLICABLE]} not applicable" if n[Verdict.NOT_APPLICABLE] else "",
            f", {len(unreadable)} unreadable" if unreadable else "",
            f" of {len(entries)} experiment run(s). ",
            "A pass needs every invariant to hold and every fault to be confirmed; an unknown proved nothing.",
            class_="counts",
        ),
        _unreadable_note(unreadable),
        el(
            "p",
            el("strong", f"Mutant run ({', '.join(mutants)}): "),
            "the worker under test has a deliberate protocol bug; a fail here means the matrix caught it.",
            class_="broken",
        )
        if mutants
        else None,
        _interrupted_note(report_dir),
        el("h2", "Run"),
        _facts_table(report_dir, entries, digest, out_dir, sealed=sealed),
        _rollup(entries, pages),
        _experiments(entries, links),
    ]
    return write_index(
        out_dir / "index.html",
        f"{verdict.words.upper()} {name}",
        body,
        built_from=f"{ARCHIVES}/",
        verdict=verdict,
        digest=digest,
    )


def _unreadable_note(unreadable: Sequence[Entry]) -> Node | None:
    """Archives that cannot be read or fail the published schema, named first:
    each is an unknown whose verdict and page say nothing of its content."""
    if not unreadable:
        return None
    return el(
        "p",
        el("strong", f"{len(unreadable)} archive(s) unreadable: "),
        "they cannot be read or do not match the published schema, so no verdict or page "
        "is built from their content (each row says why): ",
        ", ".join(f"{ARCHIVES}/{e.label}.yaml" for e in unreadable),
        class_="broken unreadable",
    )


def _interrupted_note(report_dir: Path) -> Node | None:
    """A run a stop cut says so first (results.json's run status): its cut
    experiments are unknown, and those it never started have no page."""
    results = report_dir / "results.json"
    if not results.exists():
        return None
    try:
        run = bounded_read.load_json(results).get("run", {})
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(run, dict) or run.get("status") != "interrupted":
        return None
    return el(
        "p",
        el("strong", f"Interrupted run ({run.get('interrupted')}): "),
        "the experiments it cut are unknown, and those it never started have no page "
        "(summary.md and results.json list every one). Nothing here is a complete run.",
        class_="broken",
    )


def write_index(
    path: Path, title: str, body: Sequence[Node], *, built_from: str, verdict: Verdict, digest: str
) -> Path:
    """An index page: ``body``, a footer naming what it was built from, and the
    verdict and evidence digest as attributes `fencecheck verify` and tests read."""
    footer = el(
        "footer",
        el(
            "p",
            f"Built from {built_from} by fencecheck {fencecheck_version()}; "
            "`fencecheck report` rebuilds these pages from the run directory.",
            class_="note",
        ),
    )
    text = page(title, *body, footer, data_verdict=verdict.value, data_evidence_digest=digest)
    return atomic_write_text(path, text, mode=READABLE)

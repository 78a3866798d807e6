"""Draw a :class:`Picture` as one inline SVG timeline.

Reading it: time runs left to right from the first fact; one band per lane.
Solid shapes are facts the harness observed itself, the database recorded or
the mock tool logged; hollow, dashed shapes are a worker's own account.
Hatched: a lease that expired by database time; striped: a stopped worker;
cross-hatched: a killed worker; dotted frame: a link fault. Numbered circles
are the key moments listed under the picture. Every shape has a tooltip
(``<title>``) with the full fact and its source.

Invariant: every lane, span and mark of the picture is drawn (labels may be
left out where they would overlap; their shape and tooltip stay), and every
element carries ``data-*`` attributes that name what it shows, so a test can
find it in the browser's DOM.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.evidence.html.facts import SOURCE_TEXT, Mark, Picture, Span
from harness.evidence.html.markup import Markup, el

WIDTH = 1200
LEFT = 150
RIGHT = 18
PLOT = WIDTH - LEFT - RIGHT
TRACK = 16
LABEL_ROW = 12
MAX_LABEL_ROWS = 3
CHAR_W = 5.9
GAP = 36
HARNESS_INK = "#2d3748"
TOOL_INK = "#975a16"
PALETTE = (
    "#2b6cb0",
    "#805ad5",
    "#2c7a7b",
    "#c05621",
    "#b83280",
    "#4a5568",
    "#5f7d1e",
    "#1a6c8a",
)
MAX_GUIDES = 40


def colours(workers: Sequence[str]) -> dict[str, str]:
    return {w: PALETTE[i % len(PALETTE)] for i, w in enumerate(workers)}


class _Labels:
    """Greedy placement of labels in a few rows above a track: a label goes to
    the first row where it does not overlap the previous one; when none is
    free it is left out (the shape and its tooltip remain)."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.placed: list[tuple[float, int, str, str]] = []

    def add(self, x: float, label: str, ink: str, width: float | None = None) -> None:
        if not label:
            return
        width = width if width is not None else CHAR_W * len(label) + 6
        x0 = x if x + width <= LEFT + PLOT + RIGHT else max(LEFT, x - width)
        for row, end in enumerate(self.ends):
            if x0 >= end:
                self.ends[row] = x0 + width
                self.placed.append((x0, row, label, ink))
                return
        if len(self.ends) < MAX_LABEL_ROWS:
            self.ends.append(x0 + width)
            self.placed.append((x0, len(self.ends) - 1, label, ink))

    @property
    def rows(self) -> int:
        return len(self.ends)


@dataclass
class _Row:
    lane: str
    name: str
    spans: list[Span]
    marks: list[Mark]
    labels: _Labels
    top: float = 0.0

    @property
    def height(self) -> float:
        return self.labels.rows * LABEL_ROW + TRACK + 6

    @property
    def track_y(self) -> float:
        return self.top + self.labels.rows * LABEL_ROW + 3


class _Scale:
    """Time to x, with long stretches where nothing happened squeezed to a
    fixed width (drawn as a break on the axis) so the busy parts get the room."""

    def __init__(self, picture: Picture) -> None:
        self.start, self.end = picture.start, picture.end
        points = {m.at for m in picture.marks} | {m.since for m in picture.marks if m.since}
        points |= {s.start for s in picture.spans} | {s.end for s in picture.spans if s.end}
        times = sorted(t for t in points if self.start <= t <= self.end)
        total = self.end - self.start
        self.gaps = [
            (a, b)
            for a, b in itertools.pairwise(times)
            if (b - a) / total * PLOT > 3 * GAP and b - a >= 0.2
        ]
        squeezed = sum(b - a for a, b in self.gaps)
        self.scale = (PLOT - GAP * len(self.gaps)) / max(total - squeezed, 1e-6)

    def x(self, at: float | None) -> float:
        if at is None:
            return LEFT + PLOT
        at = min(max(at, self.start), self.end)
        x: float = LEFT
        last = self.start
        for a, b in self.gaps:
            if at <= a:
                break
            x += (a - last) * self.scale
            if at < b:
                return x + GAP * (at - a) / (b - a)
            x += GAP
            last = b
        return x + (at - last) * self.scale

    def segments(self) -> list[tuple[float, float]]:
        """The stretches drawn to scale, between the squeezed gaps."""
        edges = [self.start, *(t for gap in self.gaps for t in gap), self.end]
        return list(zip(edges[::2], edges[1::2], strict=True))


class _Drawing:
    def __init__(self, picture: Picture) -> None:
        self.p = picture
        self.ink = colours(picture.workers)
        self.scale = _Scale(picture)

    def x(self, at: float | None) -> float:
        return self.scale.x(at)

    def owner_ink(self, owner: str | None, default: str = HARNESS_INK) -> str:
        return self.ink.get(owner or "", default)

    # ---------------------------------------------------------- layout
    def rows(self) -> list[_Row]:
        rows = []
        for lane in self.p.lanes:
            for name in lane.rows:
                spans = [s for s in self.p.spans if s.lane == lane.key and s.row == name]
                marks = [m for m in self.p.marks if m.lane == lane.key and m.row == name]
                labels = _Labels()
                for item in sorted(
                    [(s.start, s.label, self._span_ink(s)) for s in spans]
                    + [(m.at, m.label, self._mark_ink(m)) for m in marks],
                    key=lambda t: t[0],
                ):
                    labels.add(self.x(item[0]), item[1], item[2])
                rows.append(_Row(lane.key, name, spans, marks, labels))
        return rows

    def _span_ink(self, s: Span) -> str:
        return self.owner_ink(s.owner) if s.kind in ("epoch", "expired") else HARNESS_INK

    def _mark_ink(self, m: Mark) -> str:
        if m.source == "tool":
            return TOOL_INK
        if m.source == "worker" or m.kind == "accepted":
            return self.owner_ink(m.owner)
        return HARNESS_INK

    # ---------------------------------------------------------- shapes
    def span(self, s: Span, row: _Row, lane_top: float, lane_bottom: float) -> Markup:
        x0, x1 = self.x(s.start), self.x(s.end)
        w = max(x1 - x0, 2.0)
        tip = _tip(
            s.detail, s.source, self.p.rel(s.start), None if s.end is None else self.p.rel(s.end)
        )
        data = {
            "class_": f"span span-{s.kind}",
            "data_kind": s.kind,
            "data_source": s.source,
            "data_fault": s.fault,
            "data_owner": s.owner,
        }
        y = row.track_y

        def shape(top: float, height: float, *extra: Markup, **style: str) -> Markup:
            box = el("rect", x=_n(x0), y=_n(top), width=_n(w), height=_n(height), **style)
            return el("g", el("title", tip), box, *extra, **data)

        if s.kind in ("stopped", "killed"):
            # A band across the whole worker lane: nothing it did counts meanwhile.
            fill = "url(#stripes)" if s.kind == "stopped" else "url(#crosshatch)"
            return shape(
                lane_top + 1,
                lane_bottom - lane_top - 2,
                fill=fill,
                stroke=HARNESS_INK,
                stroke_width="1.2",
            )
        if s.kind == "link":
            return shape(
                y,
                TRACK,
                fill="url(#dots)",
                stroke=HARNESS_INK,
                stroke_width="1.5",
                stroke_dasharray="2 2",
            )
        if s.kind == "hold":
            return shape(
                y + 3,
                TRACK - 6,
                _diamond(x0, y + TRACK / 2, 5, HARNESS_INK, solid=True),
                fill="#e2e8f0",
                stroke=HARNESS_INK,
                stroke_width="1.5",
            )
        ink = self.owner_ink(s.owner)
        if s.kind == "expired":
            pattern = PALETTE.index(ink) if ink in PALETTE else "x"
            return shape(y, TRACK, fill=f"url(#hatch-{pattern})", stroke=ink, stroke_width="1")
        # An epoch held: solid in the owner's colour.
        return shape(y, TRACK, fill=ink, rx="2")

    def mark(self, m: Mark, row: _Row) -> Markup:
        x = self.x(m.at)
        y = row.track_y + TRACK / 2
        ink = self._mark_ink(m)
        tip = _tip(m.detail, m.source, self.p.rel(m.at), None)
        data = {
            "class_": f"mark mark-{m.kind}",
            "data_kind": m.kind,
            "data_source": m.source,
            "data_outcome": m.outcome,
            "data_owner": m.owner,
        }
        worker = m.source == "worker"
        parts: list[Markup] = [el("title", tip)]
        if m.since is not None and self.x(m.since) < x - 1:
            parts.append(
                el(
                    "line",
                    x1=_n(self.x(m.since)),
                    x2=_n(x),
                    y1=_n(y),
                    y2=_n(y),
                    stroke=ink,
                    stroke_width="1.5",
                    stroke_dasharray="3 2" if worker else None,
                )
            )
        parts.append(self._glyph(m, x, y, ink))
        return el("g", *parts, **data)

    def _glyph(self, m: Mark, x: float, y: float, ink: str) -> Markup:
        if m.source == "worker":
            # Hollow, dashed: the worker's account.
            if m.outcome == "fail":
                return _cross(x, y, 4.5, ink, width=1.6)
            if m.outcome in ("info", "none"):
                return el(
                    "rect",
                    x=_n(x - 3.5),
                    y=_n(y - 3.5),
                    width="7",
                    height="7",
                    fill="#fff",
                    stroke=ink,
                    stroke_width="1.4",
                    stroke_dasharray="2 1",
                )
            r = "3.5" if m.kind == "write" or m.label else "2"
            return el(
                "circle",
                cx=_n(x),
                cy=_n(y),
                r=r,
                fill="#fff",
                stroke=ink,
                stroke_width="1.4",
                stroke_dasharray="2 1" if m.label else None,
            )
        if m.kind == "accepted":
            return el(
                "rect", x=_n(x - 1.5), y=_n(y - TRACK / 2), width="3", height=_n(TRACK), fill=ink
            )
        if m.kind == "signal":
            return el(
                "polygon", points=_pts([(x - 5, y - 7), (x + 5, y - 7), (x, y + 4)]), fill=ink
            )
        if m.kind == "hit":
            if m.outcome == "crash":
                return _cross(x, y, 5.5, ink, width=3)
            size = 2.5 if m.outcome == "continue" else 5
            return _diamond(x, y, size, ink, solid=True)
        if m.kind == "failover":
            return el(
                "rect",
                x=_n(x - 2),
                y=_n(y - TRACK / 2 - 2),
                width="4",
                height=_n(TRACK + 4),
                fill=ink,
            )
        if m.kind == "resource":
            return _diamond(x, y, 6, ink, solid=True)
        if m.kind == "message":
            return el("rect", x=_n(x - 4), y=_n(y - 4), width="8", height="8", fill=ink)
        if m.kind == "status":
            return el("polygon", points=_pts([(x, y - 6), (x + 6, y), (x, y + 6)]), fill=ink)
        return el("circle", cx=_n(x), cy=_n(y), r="3.5", fill=ink)

    # ---------------------------------------------------------- whole
    def svg(self, title: str) -> Markup:
        rows = self.rows()
        moments = self.moment_layout()
        top = 34 + moments.rows * 16 + 8
        y: float = top
        lane_tops: dict[str, float] = {}
        lane_bottoms: dict[str, float] = {}
        for row in rows:
            lane_tops.setdefault(row.lane, y)
            row.top = y
            y += row.height
            lane_bottoms[row.lane] = y
        legend_top = y + 16
        height = legend_top + 78
        body: list[Markup] = [el("title", title), _defs()]
        body.append(self.lanes(rows, lane_tops, lane_bottoms))
        body.append(self.axis(top, y))
        body.append(self.guides(moments, top, y))
        for row in rows:
            body.append(
                el(
                    "g",
                    [
                        self.span(s, row, lane_tops[row.lane], lane_bottoms[row.lane])
                        for s in row.spans
                    ],
                    [self.mark(m, row) for m in row.marks],
                    [
                        el(
                            "text",
                            label,
                            x=_n(x0),
                            y=_n(row.top + (row.labels.rows - r) * LABEL_ROW - 1),
                            fill=ink,
                            class_="label",
                        )
                        for x0, r, label, ink in row.labels.placed
                    ],
                    class_="row",
                    data_row=row.name,
                    data_lane=row.lane,
                )
            )
        body.append(self.moment_badges(moments))
        body.append(_legend(legend_top))
        return el(
            "svg",
            *body,
            xmlns="http://www.w3.org/2000/svg",
            viewBox=f"0 0 {WIDTH} {_n(height)}",
            width="100%",
            role="img",
            class_="timeline",
            data_start=f"{self.p.start:.6f}",
            data_end=f"{self.p.end:.6f}",
        )

    def lanes(
        self, rows: Sequence[_Row], tops: dict[str, float], bottoms: dict[str, float]
    ) -> Markup:
        out = []
        for index, lane in enumerate(self.p.lanes):
            lane_top, lane_bottom = tops[lane.key], bottoms[lane.key]
            ink = self.ink.get(lane.worker or "", HARNESS_INK)
            parts = [
                el(
                    "rect",
                    x="0",
                    y=_n(lane_top),
                    width=str(WIDTH),
                    height=_n(lane_bottom - lane_top),
                    fill="#f7fafc" if index % 2 == 0 else "#ffffff",
                    stroke="#cbd5e0",
                    stroke_width="0.5",
                ),
                el("text", lane.title, x="8", y=_n(lane_top + 14), class_="lane-title", fill=ink),
            ]
            if lane.worker:
                parts.append(
                    el("rect", x="8", y=_n(lane_top + 19), width="26", height="5", fill=ink)
                )
            for row in rows:
                if row.lane == lane.key and (len(lane.rows) > 1 or lane.worker is None):
                    parts.append(
                        el(
                            "text",
                            row.name,
                            x=str(LEFT - 6),
                            y=_n(row.track_y + TRACK - 4),
                            class_="row-name",
                            text_anchor="end",
                        )
                    )
            if not any(r.spans or r.marks for r in rows if r.lane == lane.key):
                parts.append(
                    el(
                        "text",
                        "nothing recorded",
                        x=str(LEFT + 6),
                        y=_n(lane_top + 17),
                        class_="row-name",
                    )
                )
            out.append(el("g", *parts, class_="lane", data_lane=lane.key, data_title=lane.title))
        return el("g", out, class_="lanes")

    def axis(self, top: float, bottom: float) -> Markup:
        segments = self.scale.segments()
        shown = sum(b - a for a, b in segments)
        step = next((s for s in _STEPS if shown / s <= 12), _STEPS[-1])
        ticks = []
        for a, b in segments:
            k = math.ceil((a - self.p.start) / step - 1e-9)
            while self.p.start + k * step <= b + 1e-9:
                t = k * step
                x = self.x(self.p.start + t)
                ticks.append(
                    el(
                        "g",
                        el("line", x1=_n(x), x2=_n(x), y1="22", y2=_n(bottom), class_="grid"),
                        el(
                            "text",
                            _seconds(t, step),
                            x=_n(x),
                            y="16",
                            class_="tick",
                            text_anchor="middle",
                        ),
                    )
                )
                k += 1
        breaks = []
        for a, b in self.scale.gaps:
            x0, x1 = self.x(a), self.x(b)
            breaks.append(
                el(
                    "g",
                    el("title", f"{b - a:.3f} s in which nothing was recorded, drawn narrow"),
                    el(
                        "rect",
                        x=_n(x0 + 2),
                        y="22",
                        width=_n(x1 - x0 - 4),
                        height=_n(bottom - 22),
                        class_="gap",
                    ),
                    el(
                        "text",
                        f"≈{b - a:.2f} s",
                        x=_n((x0 + x1) / 2),
                        y=_n(top - 3),
                        class_="tick",
                        text_anchor="middle",
                    ),
                    class_="break",
                )
            )
        return el(
            "g",
            el("text", "time since the first fact", x="8", y="16", class_="tick"),
            ticks,
            breaks,
        )

    def moment_layout(self) -> _Labels:
        labels = _Labels()
        for n, m in enumerate(self.p.moments, start=1):
            labels.add(self.x(m.at) - 8, str(n), HARNESS_INK, width=17)
        return labels

    def guides(self, labels: _Labels, top: float, bottom: float) -> Markup:
        if len(self.p.moments) > MAX_GUIDES:
            return Markup("")
        return el(
            "g",
            [
                el(
                    "line",
                    x1=_n(self.x(m.at)),
                    x2=_n(self.x(m.at)),
                    y1=_n(top),
                    y2=_n(bottom),
                    class_="guide",
                )
                for m in self.p.moments
            ],
        )

    def moment_badges(self, labels: _Labels) -> Markup:
        out = []
        for _, row, label, _ink in labels.placed:
            n = int(label)
            m = self.p.moments[n - 1]
            cx, cy = self.x(m.at), 34 + row * 16
            out.append(
                el(
                    "g",
                    el("title", f"{n}. {self.p.rel(m.at)} {m.text} ({SOURCE_TEXT[m.source]})"),
                    el("circle", cx=_n(cx), cy=_n(cy), r="7", class_=f"badge badge-{m.source}"),
                    el(
                        "text",
                        str(n),
                        x=_n(cx),
                        y=_n(cy + 3.5),
                        class_="badge-n",
                        text_anchor="middle",
                    ),
                    class_="moment",
                    data_n=str(n),
                    data_source=m.source,
                )
            )
        return el("g", out, class_="moments")


_STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600)


def _seconds(t: float, step: float) -> str:
    return f"+{t:.2f} s" if step < 0.1 else f"+{t:.1f} s" if step < 1 else f"+{t:.0f} s"


def _n(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _pts(points: Iterable[tuple[float, float]]) -> str:
    return " ".join(f"{_n(x)},{_n(y)}" for x, y in points)


def _diamond(x: float, y: float, r: float, ink: str, *, solid: bool) -> Markup:
    return el(
        "polygon",
        points=_pts([(x, y - r), (x + r, y), (x, y + r), (x - r, y)]),
        fill=ink if solid else "#fff",
        stroke=ink,
    )


def _cross(x: float, y: float, r: float, ink: str, *, width: float) -> Markup:
    return el(
        "path",
        d=f"M{_n(x - r)},{_n(y - r)}L{_n(x + r)},{_n(y + r)}M{_n(x - r)},{_n(y + r)}L{_n(x + r)},{_n(y - r)}",
        stroke=ink,
        stroke_width=str(width),
        fill="none",
    )


def _tip(detail: str, source: str, at: str, until: str | None) -> str:
    when = f"{at} → {until}" if until else at
    return f"{when}: {detail} [{SOURCE_TEXT.get(source, source)}]"


def _hatch(name: str, ink: str) -> str:
    # One pattern per colour: a pattern's strokes cannot take the colour of
    # the shape that uses it.
    return (
        f'<pattern id="hatch-{name}" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff"/>'
        f'<line x1="0" y1="0" x2="0" y2="6" stroke="{ink}" stroke-width="2.5"/></pattern>'
    )


def _defs() -> Markup:
    return Markup(
        "<defs>"
        + "".join(_hatch(str(i), ink) for i, ink in enumerate(PALETTE))
        + _hatch("x", HARNESS_INK)
        + '<pattern id="stripes" width="8" height="8" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(-45)"><rect width="8" height="8" fill="#edf2f7" '
        'fill-opacity="0.85"/><line x1="0" y1="0" x2="0" y2="8" stroke="#4a5568" '
        'stroke-width="2"/></pattern>'
        '<pattern id="crosshatch" width="8" height="8" patternUnits="userSpaceOnUse">'
        '<rect width="8" height="8" fill="#e2e8f0" fill-opacity="0.9"/>'
        '<path d="M0,0L8,8M8,0L0,8" stroke="#2d3748" stroke-width="1.2"/></pattern>'
        '<pattern id="dots" width="5" height="5" patternUnits="userSpaceOnUse">'
        '<rect width="5" height="5" fill="#fff"/><circle cx="2.5" cy="2.5" r="1.1" '
        'fill="#2d3748"/></pattern>'
        "</defs>"
    )


def _swatch(fill: str, ink: str, **style: str) -> Markup:
    return el("rect", x="0", y="-10", width="22", height="12", fill=fill, stroke=ink, **style)


def _legend(top: float) -> Markup:
    ink = HARNESS_INK
    hollow = {"fill": "#fff", "stroke": ink, "stroke_dasharray": "2 1"}
    items: list[tuple[Markup, str]] = [
        (
            el("rect", x="0", y="-9", width="22", height="10", fill=PALETTE[0], rx="2"),
            "epoch held (audit trail)",
        ),
        (_swatch("url(#hatch-0)", PALETTE[0]), "lease expired (db time)"),
        (
            el("rect", x="0", y="-9", width="3", height="10", fill=PALETTE[0]),
            "write accepted (audit)",
        ),
        (el("circle", cx="5", cy="-4", r="3.5", **hollow), "worker says: ok"),
        (_cross(5, -4, 4.5, ink, width=1.6), "worker says: rejected"),
        (el("rect", x="1.5", y="-7.5", width="7", height="7", **hollow), "worker: outcome unknown"),
        (_swatch("url(#stripes)", ink), "stopped (SIGSTOP)"),
        (_swatch("url(#crosshatch)", ink), "killed"),
        (_swatch("url(#dots)", ink, stroke_dasharray="2 2"), "link fault (toxiproxy)"),
        (el("polygon", points="0,-9 10,-9 5,2", fill=ink), "signal sent (kernel-confirmed)"),
        (_diamond(5, -4, 5, ink, solid=True), "barrier hit / held"),
        (_cross(5, -4, 5, ink, width=3), "barrier answered crash"),
        (_diamond(5, -4, 6, TOOL_INK, solid=True), "tool created a resource"),
        (el("rect", x="1", y="-8", width="8", height="8", fill=TOOL_INK), "broker message"),
    ]
    per_row = 6
    out = [
        el(
            "text",
            "solid: observed by the harness, recorded by PostgreSQL or logged by the mock tool · "
            "hollow, dashed: the worker's own account · numbered circles: key moments (listed below)",
            x="8",
            y=_n(top - 2),
            class_="legend-head",
        )
    ]
    for i, (shape, words) in enumerate(items):
        x = 8 + (i % per_row) * 196
        y = top + 18 + (i // per_row) * 18
        out.append(
            el(
                "g",
                shape,
                el("text", words, x="28", y="0", class_="legend"),
                transform=f"translate({x},{_n(y)})",
            )
        )
    return el("g", out, class_="legend-box")


def timeline_svg(picture: Picture, title: str) -> Markup:
    """The picture as an inline SVG element (no script, no external reference)."""
    return _Drawing(picture).svg(title)

"""The pages' one stylesheet, inlined into every page (no file, no network).

Verdicts differ without colour too: pass is a thin solid frame with a check
mark, fail a heavy double frame in inverted type with a cross, unknown a
dashed frame in italics with a question mark, not applicable a dotted grey
frame with a dash. Colour only repeats that.
"""

from __future__ import annotations

CSS = """
:root { --ink:#1a202c; --muted:#4a5568; --line:#cbd5e0; --soft:#f7fafc;
  --pass:#22543d; --pass-bg:#f0fff4; --fail:#9b2c2c; --unknown:#744210; --unknown-bg:#fffbeb; }
* { box-sizing: border-box; }
body { font: 14px/1.45 "DejaVu Sans", "Liberation Sans", Arial, sans-serif; color: var(--ink);
  margin: 0 auto; padding: 12px 20px 40px; max-width: 1280px; background: #fff; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 3px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
a { color: #2b6cb0; }
nav { font-size: 13px; color: var(--muted); }
nav a { margin-right: 14px; }
code, pre, .mono { font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; font-size: 12px; }
pre { background: var(--soft); border: 1px solid var(--line); padding: 8px; overflow-x: auto;
  white-space: pre-wrap; word-break: break-word; }
table { border-collapse: collapse; margin: 6px 0 10px; width: 100%; }
th, td { border: 1px solid var(--line); padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #edf2f7; font-weight: 600; }
td { overflow-wrap: break-word; }
table.kv th { width: 210px; }
.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.muted { color: var(--muted); }
.note { color: var(--muted); font-size: 13px; }
details { margin: 6px 0; }
details > summary { cursor: pointer; font-weight: 600; }
.verdict { display: inline-block; padding: 1px 8px; border-radius: 3px; font-weight: 700;
  letter-spacing: .03em; white-space: nowrap; }
.verdict-pass { border: 2px solid var(--pass); color: var(--pass); background: var(--pass-bg); }
.verdict-fail { border: 4px double #fff; outline: 2px solid var(--fail); color: #fff;
  background: var(--fail); text-transform: uppercase; }
.verdict-unknown { border: 2px dashed var(--unknown); color: var(--unknown);
  background: var(--unknown-bg); font-style: italic; }
.verdict-not_applicable { border: 2px dotted var(--muted); color: var(--muted);
  background: var(--soft); }
h1 .verdict { font-size: 18px; vertical-align: 2px; margin-right: 8px; }
tr.row-fail > td:first-child { border-left: 8px double var(--fail); }
tr.row-unknown > td:first-child { border-left: 6px dashed var(--unknown); }
tr.row-pass > td:first-child { border-left: 3px solid var(--pass); }
tr.row-not_applicable > td:first-child { border-left: 3px dotted var(--muted); }
.ok-yes { color: var(--pass); font-weight: 700; }
.ok-no { color: var(--fail); font-weight: 700; }
.ok-none { color: var(--muted, #666); font-weight: 700; }
.broken { border: 3px double var(--fail); padding: 6px 14px 10px; margin: 14px 0;
  background: #fff5f5; }
.broken.unknown { border: 2px dashed var(--unknown); background: var(--unknown-bg); }
.broken h2 { border: 0; margin-top: 6px; }
.check { border-left: 4px solid var(--fail); padding: 2px 10px; margin: 8px 0; }
.check.fault { border-left: 4px dashed var(--unknown); }
.check.progress { border-left: 4px dotted var(--unknown); }
.facts td, .facts th { font-size: 13px; }
.strip a { display: inline-block; width: 16px; height: 16px; margin: 1px; text-align: center;
  font-size: 11px; line-height: 14px; text-decoration: none; border-radius: 2px; }
.strip .cell-pass { border: 1px solid var(--pass); color: var(--pass); }
.strip .cell-fail { border: 2px double var(--fail); background: var(--fail); color: #fff; }
.strip .cell-unknown { border: 1px dashed var(--unknown); color: var(--unknown); }
.strip .cell-not_applicable { border: 1px dotted var(--muted); color: var(--muted); }
ol.moments { padding-left: 34px; }
ol.moments li { margin: 1px 0; }
.src { display: inline-block; min-width: 68px; font-size: 11px; padding: 0 4px; margin-right: 6px;
  border: 1px solid var(--line); border-radius: 2px; text-align: center; }
.src-worker { border-style: dashed; font-style: italic; }
.src-harness, .src-database, .src-tool { font-weight: 600; }
.digest { font-family: "DejaVu Sans Mono", monospace; font-size: 12px; word-break: break-all; }
svg.timeline { display: block; border: 1px solid var(--line); background: #fff; margin: 6px 0; }
svg.timeline text { font-family: "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
svg .label { font-size: 10px; paint-order: stroke; stroke: #fff; stroke-width: 3px;
  stroke-linejoin: round; }
svg .gap { fill: #fff; stroke: #a0aec0; stroke-dasharray: 4 3; }
table.checks td:nth-child(-n+2) { white-space: nowrap; width: 1%; }
svg .lane-title { font-size: 12px; font-weight: 700; }
svg .row-name { font-size: 10px; fill: #718096; }
svg .tick { font-size: 10px; fill: #4a5568; }
svg .grid { stroke: #e2e8f0; stroke-width: 1; }
svg .guide { stroke: #a0aec0; stroke-width: 0.8; stroke-dasharray: 2 3; }
svg .badge { fill: #fff; stroke: #2d3748; stroke-width: 1.4; }
svg .badge-worker { stroke-dasharray: 2 1.5; }
svg .badge-n { font-size: 9px; font-weight: 700; fill: #1a202c; }
svg .legend { font-size: 10.5px; fill: #2d3748; }
svg .legend-head { font-size: 10.5px; fill: #4a5568; font-style: italic; }
@media print { details { display: block; } nav { display: none; } }
"""

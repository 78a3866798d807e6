"""A few helpers to write HTML (and inline SVG) that is always escaped.

Every page is also well-formed XML (void elements closed, only the five XML
entities), so tests can read it with ElementTree as well as in a browser.
Text is escaped unless it is :class:`Markup`, which only these helpers make.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from html import escape
from typing import Any, Union

VOID = frozenset({"br", "hr", "img", "meta", "link", "input", "col"})
SVG_LEAVES = frozenset({"rect", "line", "circle", "path", "polygon", "polyline", "use"})

Node = Union["Markup", str, int, float, None, Iterable["Node"]]


class Markup(str):
    """Text that is already markup: inserted as it is."""


# Control characters XML forbids (a torn log line may carry them): shown as U+FFFD.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
# Anything escape() or _NOT_XML would change. Most text has none of it, and one
# scan for it is much cheaper than the five replaces and the substitution.
_SPECIAL = re.compile("[&<>\"'\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def escape_text(value: str) -> str:
    """``value`` escaped for text or an attribute value (a plain str, not Markup:
    for code that builds markup strings itself)."""
    if _SPECIAL.search(value) is None:
        return value
    return escape(_NOT_XML.sub("\ufffd", value), quote=True)


def text(value: Any) -> Markup:
    """``value`` as escaped text; None is empty."""
    return Markup("" if value is None else escape_text(str(value)))


@functools.cache
def _attr_name(key: str) -> str:
    # class_ -> class, data_lane -> data-lane, aria_label -> aria-label
    return key.rstrip("_").replace("_", "-")


def attrs(values: dict[str, Any]) -> str:
    parts = []
    for key, value in values.items():
        if value is None or value is False:
            continue
        name = _attr_name(key)
        parts.append(f' {name}="{escape_text(name if value is True else str(value))}"')
    return "".join(parts)


def _parts(node: Node, out: list[str]) -> None:
    # Depth-first into one list: pages have tens of thousands of elements.
    if node is None:
        return
    if isinstance(node, str):
        out.append(node if type(node) is Markup else escape_text(node))
    elif isinstance(node, int | float):
        out.append(escape_text(str(node)))
    else:
        # Text children are handled here rather than by a call each: the
        # calls were most of the cost of a page.
        for child in node:
            if isinstance(child, str):
                out.append(child if type(child) is Markup else escape_text(child))
            elif child is not None:
                _parts(child, out)


def render(node: Node) -> Markup:
    """Markup for a node: Markup as it is, text escaped, iterables joined."""
    out: list[str] = []
    _parts(node, out)
    return Markup("".join(out))


def el(tag: str, *children: Node, **attributes: Any) -> Markup:
    """One element. Keyword attributes: ``class_="x"``, ``data_kind="y"``; None omits."""
    opening = f"<{tag}{attrs(attributes)}" if attributes else f"<{tag}"
    if tag in VOID:
        return Markup(opening + "/>")
    out: list[str] = []
    _parts(children, out)
    body = "".join(out)
    if not body and tag in SVG_LEAVES:
        return Markup(opening + "/>")
    return Markup(f"{opening}>{body}</{tag}>")


def thead(headers: Iterable[str]) -> Markup:
    return el("thead", el("tr", [el("th", h) for h in headers]))


def table(headers: Iterable[str], rows: Iterable[Iterable[Node]], **attributes: Any) -> Markup:
    """A table with a header row; cells are nodes (escaped unless Markup)."""
    head = thead(headers)
    body = el("tbody", [el("tr", [el("td", cell) for cell in row]) for row in rows])
    return el("table", head, body, **attributes)


def kv_table(rows: Iterable[tuple[Node, Node]], *, class_: str = "kv") -> Markup:
    """A two-column table: a header cell and a value cell per row."""
    return el(
        "table",
        el("tbody", [el("tr", el("th", key), el("td", value)) for key, value in rows]),
        class_=class_,
    )


def details(summary: Node, *children: Node, open_: bool = False, **attributes: Any) -> Markup:
    """A collapsible section: its content is in the page either way."""
    return el("details", el("summary", summary), *children, open=open_ or None, **attributes)

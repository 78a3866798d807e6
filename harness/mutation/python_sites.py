"""Mutation sites in the reference worker's Python, found with the ``ast`` module.

Operators (each one edit of the original text, each a plausible single mistake):

| operator | change |
|---|---|
| ``negate_compare`` | ``==``/``!=``, ``<``/``>=``, ``>``/``<=``, ``in``/``not in``, ``is``/``is not`` (one operator of a comparison) |
| ``and_or`` | every ``and`` of one boolean expression -> ``or``, or every ``or`` -> ``and`` |
| ``drop_not`` | ``not x`` -> ``x`` |
| ``drop_raise`` | a ``raise`` statement -> ``pass`` |
| ``swap_args`` | two neighbouring positional arguments of a call swapped, where the callee (a function, method or dataclass of the reference implementation, by name) declares both parameters with the same type: a swap across types fails at once and says nothing about the matrix |
| ``drop_increment`` | ``x + 1`` -> ``x`` |
| ``drop_call`` | a call made for its effect (an expression statement) -> ``pass`` |

Left alone, so the set is not flooded with mutants no test could tell
apart: logging, metrics and the history/injection instrumentation (calls of
``log``, ``logs.*``, ``logging.*``, ``_log.*``, ``metrics.*``,
``injection.*`` and ``*.record``, with everything inside them, and an ``if``
whose branches hold nothing else); ``assert`` statements; ``if
TYPE_CHECKING`` blocks; annotations; ``__repr__`` / ``__str__``.

Invariant: an expression site's edited snippet parses and its tree differs
from the original's (checked by :func:`python_sites`); a statement site
becomes ``pass``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

from harness.mutation.sites import Edit, Site, apply_edits

_NEGATED: dict[type[ast.cmpop], str] = {
    ast.Eq: "!=",
    ast.NotEq: "==",
    ast.Lt: ">=",
    ast.GtE: "<",
    ast.Gt: "<=",
    ast.LtE: ">",
    ast.In: "not in",
    ast.NotIn: "in",
    ast.Is: "is not",
    ast.IsNot: "is",
}
_OPERATOR_TEXT = re.compile(r"not\s+in\b|is\s+not\b|==|!=|<=|>=|<|>|\bin\b|\bis\b")
_INSTRUMENTATION_ROOTS = frozenset(
    {"log", "logs", "logging", "_log", "metrics", "injection", "history", "print"}
)
_INSTRUMENTATION_NAME = re.compile(r"^_?log(_|$)")
# .record: history events; .add_argument: CLI declarations (the harness
# configures workers through the environment, never through flags).
_INSTRUMENTATION_METHODS = frozenset({"record", "add_argument"})

_SKIPPED_FUNCTIONS = frozenset({"__repr__", "__str__"})


Signatures = dict[str, list[list[str | None]]]


def signatures(texts: dict[str, str]) -> Signatures:
    """Parameter annotations by callee name, over every file: functions and methods
    (without ``self``/``cls``), dataclasses (their fields) and classes (``__init__``)."""
    found: Signatures = {}

    def note(name: str, annotations: list[ast.expr | None]) -> None:
        found.setdefault(name, []).append(
            [None if a is None else ast.unparse(a) for a in annotations]
        )

    for source, text in texts.items():
        for node in ast.walk(ast.parse(text, source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                params = [*node.args.posonlyargs, *node.args.args]
                if params and params[0].arg in ("self", "cls"):
                    params = params[1:]
                note(node.name, [p.annotation for p in params])
            elif isinstance(node, ast.ClassDef):
                fields = [
                    s.annotation
                    for s in node.body
                    if isinstance(s, ast.AnnAssign)
                    and isinstance(s.target, ast.Name)
                    and "ClassVar" not in ast.unparse(s.annotation)
                ]
                if any(_decorator_name(d) == "dataclass" for d in node.decorator_list):
                    note(node.name, list(fields))
    return found


def _decorator_name(node: ast.expr) -> str | None:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else None


def _same_type(sigs: Signatures, call: ast.Call, k: int) -> bool:
    """Does every callee of this name declare parameters k and k+1 with one type?"""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    candidates = sigs.get(name or "", [])
    if not candidates:
        return False
    for params in candidates:
        if len(params) <= k + 1 or params[k] is None or params[k] != params[k + 1]:
            return False
    return True


class _Positions:
    """Offsets of (line, column) pairs in one file's text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._line_starts = [0]
        for match in re.finditer("\n", text):
            self._line_starts.append(match.end())
        self._lines = text.splitlines(keepends=True)

    def offset(self, line: int, col_utf8: int) -> int:
        # ast columns count UTF-8 bytes.
        raw = self._lines[line - 1].encode()[:col_utf8]
        return self._line_starts[line - 1] + len(raw.decode())

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def source(self, node: ast.AST) -> str:
        return self.text[self.start(node) : self.end(node)]


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def is_instrumentation(call: ast.Call, extra_roots: frozenset[str] = frozenset()) -> bool:
    """A call that only logs, counts, prints or records history (no protocol effect);
    ``extra_roots``: names bound to a history operation (``with history.operation() as h``)."""
    if isinstance(call.func, ast.Attribute) and call.func.attr in _INSTRUMENTATION_METHODS:
        return True
    root = _root_name(call.func)
    if root is None:
        return False
    return (
        root in _INSTRUMENTATION_ROOTS
        or root in extra_roots
        or bool(_INSTRUMENTATION_NAME.match(root))
    )


@dataclass
class _Finder(ast.NodeVisitor):
    pos: _Positions
    sites: list[Site]
    scope: list[str]
    sigs: Signatures
    history_names: frozenset[str] = frozenset()

    def instrumentation(self, call: ast.Call) -> bool:
        return is_instrumentation(call, self.history_names)

    def only_instrumentation(self, body: list[ast.stmt]) -> bool:
        return all(
            isinstance(s, ast.Expr)
            and isinstance(s.value, ast.Call)
            and self.instrumentation(s.value)
            for s in body
        )

    def add(self, operator: str, edits: list[Edit], node: ast.AST) -> None:
        lo, hi = self.pos.start(node), self.pos.end(node)
        original = self.pos.text[lo:hi]
        local = [Edit(e.start - lo, e.end - lo, e.replacement) for e in edits]
        self.sites.append(
            Site(
                ".".join(self.scope) or "<module>",
                operator,
                tuple(edits),
                original,
                apply_edits(original, local),
            )
        )

    # ------------------------------------------------------ scopes and skips
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        for stmt in node.body:
            self.visit(stmt)
        self.scope.pop()

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in _SKIPPED_FUNCTIONS:
            return
        self.scope.append(node.name)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        for stmt in node.body:
            self.visit(stmt)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        return

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        if self.only_instrumentation(node.body) and self.only_instrumentation(node.orelse):
            return
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        value = node.value
        if isinstance(value, ast.Call):
            if self.instrumentation(value):
                return
            self.add("drop_call", [Edit(self.pos.start(node), self.pos.end(node), "pass")], node)
        if isinstance(value, ast.Constant):
            return  # a docstring
        self.generic_visit(node)

    # ------------------------------------------------------ operators
    def visit_With(self, node: ast.With) -> None:
        bound = {
            item.optional_vars.id
            for item in node.items
            if isinstance(item.context_expr, ast.Call)
            and _root_name(item.context_expr.func) == "history"
            and isinstance(item.optional_vars, ast.Name)
        }
        saved = self.history_names
        self.history_names = saved | bound
        for item in node.items:
            self.visit(item.context_expr)
        for stmt in node.body:
            self.visit(stmt)
        self.history_names = saved

    def visit_Call(self, node: ast.Call) -> None:
        if self.instrumentation(node):
            return
        args = node.args
        for k in range(len(args) - 1):
            a, b = args[k], args[k + 1]
            if isinstance(a, ast.Starred) or isinstance(b, ast.Starred):
                break  # positions after a *args are unknown
            ta, tb = self.pos.source(a), self.pos.source(b)
            if ta == tb or not _same_type(self.sigs, node, k):
                continue
            edits = [
                Edit(self.pos.start(a), self.pos.end(a), tb),
                Edit(self.pos.start(b), self.pos.end(b), ta),
            ]
            self.add("swap_args", edits, node)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for k, op in enumerate(node.ops):
            gap_start, gap_end = self.pos.end(operands[k]), self.pos.start(operands[k + 1])
            match = _OPERATOR_TEXT.search(self.pos.text, gap_start, gap_end)
            if match is None:
                continue
            edit = Edit(match.start(), match.end(), _NEGATED[type(op)])
            self.add("negate_compare", [edit], node)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        word, other = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        edits: list[Edit] = []
        for a, b in zip(node.values, node.values[1:], strict=False):
            gap = re.compile(rf"\b{word}\b")
            match = gap.search(self.pos.text, self.pos.end(a), self.pos.start(b))
            if match is not None:
                edits.append(Edit(match.start(), match.end(), other))
        if len(edits) == len(node.values) - 1:
            self.add("and_or", edits, node)
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            edit = Edit(self.pos.start(node), self.pos.start(node.operand), "")
            self.add("drop_not", [edit], node)
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        self.add("drop_raise", [Edit(self.pos.start(node), self.pos.end(node), "pass")], node)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if (
            isinstance(node.op, ast.Add)
            and isinstance(node.right, ast.Constant)
            and node.right.value == 1
            and not isinstance(node.right.value, bool)
        ):
            edit = Edit(self.pos.end(node.left), self.pos.end(node), "")
            self.add("drop_increment", [edit], node)
        self.generic_visit(node)


class PythonSiteError(ValueError):
    """A generated edit does not parse or changes nothing (a generator bug)."""


def _sites(text: str, sigs: Signatures) -> Iterator[Site]:
    finder = _Finder(_Positions(text), [], [], sigs)
    finder.visit(ast.parse(text))
    yield from finder.sites


def _expression(snippet: str) -> str:
    return ast.dump(ast.parse("(\n" + snippet + "\n)", mode="eval"))


def python_sites(text: str, source: str, sigs: Signatures) -> list[Site]:
    """Every site of one Python file. An expression site's snippet is checked to
    parse, before and after, and to differ (a statement site becomes ``pass``);
    the whole mutated file is compiled later, by the mutant's preflight.
    ``sigs``: :func:`signatures` of every file mutated (for ``swap_args``)."""
    checked: list[Site] = []
    for site in _sites(text, sigs):
        if site.replacement != "pass":
            try:
                same = _expression(site.original) == _expression(site.replacement)
            except SyntaxError as exc:
                raise PythonSiteError(f"{source}: {site.operator} at {site.scope}: {exc}") from exc
            if same:
                raise PythonSiteError(f"{source}: {site.operator} at {site.scope} changes nothing")
        checked.append(site)
    return checked

"""What a mutant is: one named break of one protocol rule, and how it is made.

A mutant alters the correct :class:`~reference_impl.protocol.Protocol` in
exactly ONE place, in one of four ways:

- :class:`Component`: one component class (``leases_cls``, ``writer_cls``,
  ...) swapped for a subclass that overrides one method;
- :class:`Statement`: one named SQL statement replaced (``Queries.replace``);
- :class:`Method`: one of the Protocol's own rule methods (``operation_id``,
  ``decode_checkpoint``) replaced;
- :class:`SqlOverlay`: one SQL file that ``migrate`` applies after the
  migrations (a ``CREATE OR REPLACE FUNCTION`` of one ``fencecheck.*``
  function, or the DDL of one database rule): needed wherever the worker
  role cannot bypass the database, which is where rules 1-4, 6, 7 and 12 live.

Invariants (checked when a Mutant is made): the rule is one of docs/protocol.md's
1-13; at least one catcher, each an experiment id (A-W); a component subclass
derives from the class it replaces.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, LiteralString

from reference_impl.protocol import Protocol
from reference_impl.queries import Queries

SQL_DIR = Path(__file__).parent / "sql"
RULES = range(1, 14)
EXPERIMENTS = frozenset("ABCDEFGHIJKLMNOPQRSTUVW")
#: Protocol attributes a Component may swap, with the class each must extend.
SLOTS: dict[str, type] = {
    slot: getattr(Protocol, slot)
    for slot in (
        "leases_cls",
        "writer_cls",
        "ledger_cls",
        "dispatcher_cls",
        "reconciler_cls",
        "heartbeat_cls",
        "relay_cls",
        "consumer_cls",
        "runs_cls",
    )
}
METHODS = ("operation_id", "decode_checkpoint", "backoff_ms")


@dataclass(frozen=True)
class Component:
    """Swap one component class for a subclass overriding one method."""

    slot: str
    cls: type

    kind: ClassVar[str] = "component"

    def describe(self) -> str:
        (method,) = overridden_methods(self.cls)
        return f"{self.slot} = {self.cls.__name__} (overrides {SLOTS[self.slot].__name__}.{method})"


@dataclass(frozen=True)
class Statement:
    """Replace one named SQL statement."""

    name: str
    sql: LiteralString

    kind: ClassVar[str] = "statement"

    def describe(self) -> str:
        return f"statement {self.name!r} replaced"


@dataclass(frozen=True)
class Method:
    """Replace one of the Protocol's own rule methods."""

    name: Literal["operation_id", "decode_checkpoint", "backoff_ms"]
    fn: Callable[..., Any]

    kind: ClassVar[str] = "method"

    def describe(self) -> str:
        return f"Protocol.{self.name} replaced"


@dataclass(frozen=True)
class SqlOverlay:
    """One SQL file applied by ``migrate`` after the migrations.

    ``target`` names the one database object it changes: a function
    (``fencecheck.renew``) or a rule's DDL (``RLS on the tenant tables``).
    """

    file: str
    target: str

    kind: ClassVar[str] = "sql_overlay"

    @property
    def path(self) -> Path:
        return SQL_DIR / self.file

    def describe(self) -> str:
        return f"SQL overlay {self.file} ({self.target})"


Alteration = Component | Statement | Method | SqlOverlay


def overridden_methods(cls: type) -> list[str]:
    """Methods ``cls`` defines itself (not inherited), dunders excluded."""
    return sorted(
        name
        for name, value in vars(cls).items()
        if not name.startswith("__") and callable(value) and not isinstance(value, type)
    )


_ID = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Mutant:
    """One named mutation of the reference implementation."""

    name: str
    rule: int
    catchers: tuple[str, ...]
    description: str
    alteration: Alteration

    def __post_init__(self) -> None:
        if not _ID.match(self.name):
            raise ValueError(f"mutant name {self.name!r} must be snake_case")
        if self.rule not in RULES:
            raise ValueError(
                f"mutant {self.name}: rule {self.rule} is not one of docs/protocol.md's rules 1-13"
            )
        if not self.catchers or not set(self.catchers) <= EXPERIMENTS:
            raise ValueError(f"mutant {self.name}: catchers {self.catchers} must be experiment ids")
        alt = self.alteration
        if isinstance(alt, Component):
            base = SLOTS.get(alt.slot)
            if base is None or not issubclass(alt.cls, base):
                raise ValueError(f"mutant {self.name}: {alt.cls} does not replace {alt.slot}")
        if isinstance(alt, Method) and alt.name not in METHODS:
            raise ValueError(f"mutant {self.name}: Protocol.{alt.name} is not a rule method")

    def protocol_class(self) -> type[Protocol]:
        """The correct Protocol with this mutant's one alteration."""
        alt = self.alteration
        attrs: dict[str, Any] = {
            "__doc__": f"Mutant {self.name} (rule {self.rule}): {self.description}",
            "__module__": __name__,
            "name": self.name,
            "caught_by": ",".join(self.catchers),
        }
        if isinstance(alt, Component):
            attrs[alt.slot] = alt.cls
        elif isinstance(alt, Statement):
            name, sql = alt.name, alt.sql

            def load_queries(self: Protocol) -> Queries:
                return Queries.load().replace(name, sql)

            attrs["load_queries"] = load_queries
        elif isinstance(alt, Method):
            attrs[alt.name] = alt.fn
        else:
            attrs["sql_overlays"] = (alt.path,)
        return type(f"Mutant_{self.name}", (Protocol,), attrs)

    def __call__(self) -> Protocol:
        """``load_protocol`` calls registry entries to get the Protocol to run."""
        return self.protocol_class()()

    def as_dict(self) -> dict[str, Any]:
        """What ``python -m reference_impl.worker mutants`` prints for this mutant."""
        return {
            "name": self.name,
            "rule": self.rule,
            "catchers": list(self.catchers),
            "description": self.description,
            "alters": self.alteration.describe(),
        }

"""Block YAML for plain data, written directly: the archives' emitter.

PyYAML builds a node object for every scalar and resolves each one before
its (C) emitter sees it; for a run's archives (a few MB of YAML each run)
that was the largest single cost of writing the evidence. Plain data
(dicts with string keys, lists, strings, numbers, booleans, None) needs
none of that: this module writes it in one pass, in the same block style
(mappings in key order, sequences under a key not indented, ``{}``/``[]``
when empty), and anything it is not sure of goes back to PyYAML:

- a string is written plain only when PyYAML's own resolver reads it back
  as that string (not ``yes``, ``1:20``, ``2026-12-06``, ``~``...) and it
  has no character or pair (``: ``, `` #``) that means something in YAML;
- a string of several lines is a literal block (``|``) when its lines are
  safe to indent, so logs and tracebacks stay readable;
- every other string is double-quoted with JSON's escapes (a subset of
  YAML's), and the characters YAML does not allow raw escaped as well;
- a string with a lone surrogate (libyaml reads no escaped one back), a
  value of another type, a key that is not a string or longer than a
  YAML simple key may be: the whole document is PyYAML's.

tests/harness/test_yaml_emit.py checks that PyYAML's safe loader reads every
output back as the value written, on generated data and real archives.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml
from yaml.resolver import Resolver

_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = Resolver()

# Characters YAML allows in no scalar raw, beyond the C0 controls: C1
# controls, the Unicode line breaks, the BOM, surrogates, non-characters.
_NEVER_RAW = r"\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff\ufffe\uffff"
# A plain scalar: no indicator first, no blank at either end, no ": " or
# " #", nothing that is not printable and no line break.
_PLAIN = re.compile(
    rf"(?![\s\-?:,\[\]{{}}#&*!|>'\"%@`.~])"
    rf"(?:[^\x00-\x1f{_NEVER_RAW}:#]|:(?! )|(?<! )#)+"
    r"(?<![\s:])"
)
# Characters a double-quoted scalar may not hold raw (json.dumps already
# escaped the C0 controls, the quote and the backslash).
_UNPRINTABLE = re.compile(rf"[{_NEVER_RAW}]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# A single-quoted scalar: one line of printable characters.
_SINGLE_OK = re.compile(rf"[^\x00-\x1f{_NEVER_RAW}]*")
# A literal block's lines: printable, no tab or carriage return.
_LITERAL_OK = re.compile(rf"[^\x00-\x09\x0b-\x1f{_NEVER_RAW}]*")
# An archive's keys are a few hundred names written over and over.
_KEYS: dict[str, str] = {}
_KEYS_KEPT = 4096
# PyYAML's scanner takes a simple key of at most 1024 characters.
_MAX_KEY = 1000


class _NotPlain(Exception):
    """A value this module does not write: the document goes to PyYAML."""


def emit_yaml(value: Any) -> str:
    """``value`` as a block YAML document that ``yaml.safe_load`` reads back
    equal (PyYAML writes what this module does not, see the module doc)."""
    try:
        out: list[str] = []
        if isinstance(value, dict) and value:
            _mapping(value, "", out, "")
        elif isinstance(value, list) and value:
            _sequence(value, "", out, "")
        else:
            out.append(_scalar(value, "  ") + "\n")
        return "".join(out)
    except _NotPlain:
        return yaml.dump(
            value,
            Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
            sort_keys=False,
            allow_unicode=True,
            width=100,
        )


def _mapping(value: dict[Any, Any], indent: str, out: list[str], lead: str) -> None:
    """Write ``value``'s entries at ``indent``; the first line starts with
    ``lead`` instead (a sequence item's ``- ``)."""
    inner = indent + "  "
    for key, item in value.items():
        if not isinstance(key, str) or len(key) > _MAX_KEY:
            raise _NotPlain
        k = _key(key)
        if isinstance(item, dict) and item:
            out.append(f"{lead}{k}:\n")
            _mapping(item, inner, out, inner)
        elif isinstance(item, list) and item:
            out.append(f"{lead}{k}:\n")
            _sequence(item, indent, out, indent)  # PyYAML's style: not indented
        else:
            out.append(f"{lead}{k}: {_scalar(item, inner)}\n")
        lead = indent


def _sequence(value: list[Any], indent: str, out: list[str], lead: str) -> None:
    inner = indent + "  "
    for item in value:
        if isinstance(item, dict) and item:
            _mapping(item, inner, out, lead + "- ")
        elif isinstance(item, list) and item:
            _sequence(item, inner, out, lead + "- ")
        else:
            out.append(f"{lead}- {_scalar(item, inner)}\n")
        lead = indent


def _key(key: str) -> str:
    known = _KEYS.get(key)
    if known is None:
        plain = _is_plain(key) and not key.startswith(("---", "..."))
        known = key if plain else _quoted(key)
        if len(_KEYS) < _KEYS_KEPT:
            _KEYS[key] = known
    return known


def _scalar(value: Any, indent: str) -> str:
    """A scalar on the rest of a line; a literal block's lines at ``indent``."""
    if isinstance(value, str):
        if _is_plain(value):
            return value
        if "\n" in value:
            block = _literal(value, indent)
            if block is not None:
                return block
        return _quoted(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:  # not a subclass: an IntEnum's str() is its name
        return str(value)
    if type(value) is float:
        return _float(value)
    if value == {} and isinstance(value, dict):
        return "{}"
    if value == [] and isinstance(value, list):
        return "[]"
    raise _NotPlain


def _is_plain(text: str) -> bool:
    if _PLAIN.fullmatch(text) is None:
        return False
    # What a safe loader makes of it, by the same resolver (YAML 1.1's bools,
    # numbers, timestamps, nulls, merge and value keys).
    tag = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    return bool(tag == _STR_TAG)


def _quoted(text: str) -> str:
    """Single-quoted when the text is one printable line (only ``'`` is
    doubled: the most readable for text full of JSON), else double-quoted."""
    if _SINGLE_OK.fullmatch(text) is not None:
        return "'" + text.replace("'", "''") + "'"
    quoted = json.dumps(text, ensure_ascii=False)
    if _UNPRINTABLE.search(quoted):
        if _SURROGATE.search(text):
            raise _NotPlain  # libyaml reads no escaped surrogate back
        quoted = _UNPRINTABLE.sub(_escape, quoted)
    return quoted


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02X}" if code <= 0xFF else f"\\u{code:04X}"


def _literal(text: str, indent: str) -> str | None:
    """``text`` as a literal block scalar (``|``, ``|-`` or ``|+`` for its
    trailing line breaks), or None when a line could change meaning: a
    first line that starts with a blank (the block's indentation is read
    from it), a line of blanks only, a tab, a carriage return or a
    character YAML does not allow raw."""
    if _LITERAL_OK.fullmatch(text) is None or text[0] in " \n":
        return None
    body = text.rstrip("\n")
    trailing = len(text) - len(body)
    lines = body.split("\n")
    if any(line.isspace() for line in lines):
        return None
    chomp = "-" if trailing == 0 else "" if trailing == 1 else "+"
    out = [f"|{chomp}"]
    out.extend(f"{indent}{line}" if line else "" for line in lines)
    out.extend("" for _ in range(trailing - 1))
    return "\n".join(out)


def _float(value: float) -> str:
    """As PyYAML's representer writes a float (so it reads back as one)."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value).lower()
    if "." not in text and "e" in text:
        text = text.replace("e", ".0e", 1)
    return text

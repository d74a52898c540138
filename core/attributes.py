"""Search attributes: the typed values a run sets about itself so that clients can list,
count and act on runs by them (docs/operations.md, "Search attributes").

A workflow declares its attributes' types (`attributes={"region": str, "amount":
float}`) and sets them in its turns (`ctx.set_attributes`); each commit writes them
to `run_attributes` (schema/0030). A value is kept as JSON: a string or a number (a
`bool`, `int`, `float`, `str` or `datetime` in Python), and each type is indexed
where its order is the value's order: strings and booleans as text, numbers as
double precision, times as their UTC ISO 8601 text (so that text order is time
order).

This module is the sans-I/O part: the declared types, a value checked and encoded,
and filters (`region=eu`, `amount>=100`) parsed and checked, for every front end.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shardq.core.errors import InvalidArgument
from shardq.core.rules import check_name, check_text

TYPES: dict[type, str] = {str: "str", int: "int", float: "float", bool: "bool",
                          datetime: "datetime"}
"""The Python types an attribute may be declared with, and their names."""

MAX_ATTRIBUTES = 32
"""Attributes one workflow may declare."""
MAX_TEXT = 256
"""Characters of a string attribute's value (an index entry's key)."""
MAX_FILTERS = 4
"""Attribute filters one page, count or bulk action may combine."""
MAX_EXACT_INT = 2**53
"""Integers beyond this lose their value as double precision: refused."""

OPERATORS = ("=", "<", "<=", ">", ">=")


def check_declared(declared: object, workflow: str) -> dict[str, str]:
    """A workflow's `attributes` setting, as name -> type name; InvalidArgument if bad."""
    if not isinstance(declared, Mapping):
        raise InvalidArgument(f"workflow {workflow}: attributes must be a mapping of names "
                              f"to types, got {type(declared).__name__}")
    if len(declared) > MAX_ATTRIBUTES:
        raise InvalidArgument(f"workflow {workflow}: at most {MAX_ATTRIBUTES} attributes, "
                              f"got {len(declared)}")
    types: dict[str, str] = {}
    for name, kind in declared.items():
        check_name(name, "attribute")
        if kind not in TYPES:
            raise InvalidArgument(
                f"workflow {workflow}: attribute {name!r} has type {kind!r}; declare one of "
                + ", ".join(TYPES.values()))
        types[name] = TYPES[kind]
    return types


def encoded(name: str, value: object, kind: str) -> Any:
    """`value` of attribute `name` declared as `kind`, as the JSON value stored (None
    removes the attribute); InvalidArgument when it is not of that type."""
    if value is None:
        return None
    ok = {"str": isinstance(value, str),
          "bool": isinstance(value, bool),
          "int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, int | float) and not isinstance(value, bool),
          "datetime": isinstance(value, datetime)}[kind]
    if not ok:
        raise InvalidArgument(f"attribute {name!r} is declared {kind}, got "
                              f"{type(value).__name__} {value!r:.80}")
    return _scalar(name, value)


def _scalar(name: str, value: Any) -> Any:
    """A typed value as stored: text within MAX_TEXT, a finite exact number, a time's
    UTC ISO 8601 text (which sorts as the time does)."""
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise InvalidArgument(f"attribute {name!r}: a datetime needs a time zone")
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, str):
        check_text(value, f"attribute {name!r}")
        if len(value) > MAX_TEXT:
            raise InvalidArgument(f"attribute {name!r}: at most {MAX_TEXT} characters, got "
                                  f"{len(value)}")
        return value
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) > MAX_EXACT_INT:
        raise InvalidArgument(f"attribute {name!r}: integers within +-2**53, got {value}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"attribute {name!r}: a finite number, got {value}")
    if isinstance(value, int | float):
        return value
    raise InvalidArgument(f"attribute {name!r}: a string, number, boolean or datetime, got "
                          f"{type(value).__name__}")


@dataclass(frozen=True)
class AttributeFilter:
    """One condition on an attribute: `name op value`, `value` as stored (text for
    strings, booleans and times; a number)."""

    name: str
    op: str
    value: str | float

    @property
    def numeric(self) -> bool:
        return not isinstance(self.value, str)

    def __str__(self) -> str:
        return f"{self.name}{self.op}{json.dumps(self.value)}"


_EXPRESSION = re.compile(r"\s*([^<>=\s]+)\s*(<=|>=|=|<|>)(.*)", re.DOTALL)


def parse_filter(text: object) -> AttributeFilter:
    """`NAME OP VALUE` (OP one of = < <= > >=): VALUE is read as JSON when it is a JSON
    number, true, false or a "quoted string", else as the string it is, so `region=eu`,
    `amount>=100` and `order_id="123"` (a string of digits) all say what they mean; a
    VALUE that starts with an operator is refused, unless quoted."""
    if not isinstance(text, str):
        raise InvalidArgument(f"an attribute filter is a string NAME=VALUE, got {text!r:.80}")
    match = _EXPRESSION.fullmatch(text)
    if match is None or match.group(3).lstrip().startswith(("<", ">", "=")):
        # `a>>3`, `a==3`: a typo, not a comparison with text that starts with `>`
        # (which a "quoted string" still says)
        raise InvalidArgument(f"attribute filter {text!r:.80} is not NAME OP VALUE "
                              f"(OP one of {' '.join(OPERATORS)})")
    name, op, raw = match.group(1), match.group(2), match.group(3).strip()
    try:
        value: Any = json.loads(raw)
        if not isinstance(value, str | int | float | bool) or raw.startswith(("N", "I", "-I")):
            value = raw  # NaN, Infinity, objects and lists are the text they are
    except ValueError:
        value = raw
    return attribute_filter(name, op, value)


def attribute_filter(name: object, op: str, value: object) -> AttributeFilter:
    """A filter from typed parts: a str, bool, number or aware datetime `value`."""
    check_name(name, "attribute")
    assert isinstance(name, str)
    if op not in OPERATORS:
        raise InvalidArgument(f"attribute filter operator must be one of {OPERATORS}, got "
                              f"{op!r}")
    stored = _scalar(name, value)
    if isinstance(stored, bool):
        stored = "true" if stored else "false"  # indexed with the text (schema/0030)
    return AttributeFilter(name, op, stored if isinstance(stored, str) else float(stored))


def check_filters(where: object) -> tuple[AttributeFilter, ...]:
    """A caller's `where`: None, a mapping of names to values (equalities), or a sequence
    of `NAME OP VALUE` strings; at most MAX_FILTERS of them."""
    if where is None:
        return ()
    if isinstance(where, Mapping):
        found = tuple(attribute_filter(name, "=", value) for name, value in where.items())
    elif isinstance(where, Sequence) and not isinstance(where, str | bytes):
        found = tuple(f if isinstance(f, AttributeFilter) else parse_filter(f) for f in where)
    else:
        raise InvalidArgument("where must be a mapping of attribute names to values or a "
                              f"list of NAME=VALUE filters, got {type(where).__name__}")
    if len(found) > MAX_FILTERS:
        raise InvalidArgument(f"at most {MAX_FILTERS} attribute filters, got {len(found)}")
    return found

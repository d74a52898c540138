"""An HTML form from an interrupt's JSON Schema, and the payload back from what was posted.

Fields a form input can hold take one: a string (a select when it has an
`enum`), a number or integer, a boolean (a checkbox). Anything else (nested
objects, arrays, unions) is a JSON text area. The input carries what the
browser can check itself (required, min/max, lengths, pattern); the server
checks the whole payload against the schema again (Client.decide) and the
violations are shown next to their fields.

The form starts from the value under review (`ctx.interrupt(value=...)`), so a
reviewer changes the fields they mean to change and sends the rest as it was.
A value that a field cannot hold as it is leaves that field empty: a browser
would otherwise alter it silently (a text input drops a string's line breaks).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from shardq.core.rules import RuleBroken, json_value, pointer

SIMPLE = ("string", "integer", "number", "boolean")


@dataclass(frozen=True)
class Field:
    name: str
    kind: str
    """`string`, `integer`, `number`, `boolean`, `enum` or `json`."""
    required: bool
    title: str
    description: str
    options: tuple[str, ...] = ()
    attrs: tuple[tuple[str, str], ...] = ()
    """Constraint attributes of the input: (name, value), value "" for a bare attribute."""

    @property
    def path(self) -> str:
        return pointer([self.name])


def fields_of(schema: dict[str, Any] | None) -> list[Field] | None:
    """The form's fields, in the schema's order; None: the payload is one JSON text."""
    if not isinstance(schema, dict) or schema.get("type") != "object" or not isinstance(
        schema.get("properties"), dict
    ):
        return None
    required = set(schema.get("required") or ())
    return [_field(name, spec if isinstance(spec, dict) else {}, name in required)
            for name, spec in schema["properties"].items()]


def _field(name: str, spec: dict[str, Any], required: bool) -> Field:
    kind = spec.get("type")
    title = str(spec.get("title") or name)
    description = str(spec.get("description") or "")
    if isinstance(spec.get("enum"), list) and all(isinstance(v, str) for v in spec["enum"]):
        return Field(name, "enum", required, title, description, tuple(spec["enum"]))
    if kind not in SIMPLE:
        return Field(name, "json", required, title, description)
    attrs: list[tuple[str, str]] = []
    if kind == "string":
        for key, attr in (("minLength", "minlength"), ("maxLength", "maxlength")):
            if isinstance(spec.get(key), int):
                attrs.append((attr, str(spec[key])))
        if isinstance(spec.get("pattern"), str):
            attrs.append(("pattern", spec["pattern"]))
    if kind in ("integer", "number"):
        for key, attr in (("minimum", "min"), ("maximum", "max")):
            if isinstance(spec.get(key), int | float):
                attrs.append((attr, str(spec[key])))
        attrs.append(("step", "1" if kind == "integer" else "any"))
    return Field(name, str(kind), required, title, description, attrs=tuple(attrs))


def payload_from(
    fields: list[Field] | None, form: dict[str, str]
) -> tuple[Any, list[dict[str, str]]]:
    """The payload the posted form describes, and the violations of reading it (a number
    that is not one, JSON that is not JSON), each at its field's pointer."""
    problems: list[dict[str, str]] = []
    if fields is None:
        return _json(form.get("payload", ""), "", problems), problems
    payload: dict[str, Any] = {}
    for field in fields:
        raw = form.get(f"field:{field.name}")
        if field.kind == "boolean":
            payload[field.name] = raw is not None
            continue
        if raw is None or raw == "":
            continue  # absent: the schema's `required` says whether that is allowed
        if field.kind in ("string", "enum"):
            payload[field.name] = raw
        elif field.kind in ("integer", "number"):
            number = _number(raw, field.kind == "integer")
            if number is None:
                wanted = "an integer" if field.kind == "integer" else "a number"
                problems.append({"message": f"{raw!r} is not {wanted}",
                                 "field_path": field.path})
            else:
                payload[field.name] = number
        else:
            value = _json(raw, field.path, problems)
            if not problems or problems[-1]["field_path"] != field.path:
                payload[field.name] = value
    return payload, problems


def initial_form(fields: list[Field] | None, value: Any) -> dict[str, str]:
    """The form's starting contents from `value`, by input name, as `payload_from` reads
    them back: each field the value fills, as the text its input shows."""
    if value is None:
        return {}
    if fields is None:
        return {"payload": json.dumps(value, indent=2, ensure_ascii=False)}
    if not isinstance(value, dict):
        return {}
    shown = {}
    for field in fields:
        if field.name in value:
            text = _shown(field, value[field.name])
            if text is not None:
                shown[f"field:{field.name}"] = text
    return shown


def _shown(field: Field, value: Any) -> str | None:
    """The text `field`'s input holds for `value`, None when it cannot hold it unaltered."""
    if field.kind == "json":
        return json.dumps(value, indent=2, ensure_ascii=False)
    if field.kind in ("string", "enum"):
        fits = isinstance(value, str) and (
            value in field.options if field.kind == "enum"
            # A text input holds one line: the browser would strip the line breaks.
            else not any(c in value for c in "\r\n"))
        return value if fits else None
    if field.kind == "boolean":
        return "true" if value is True else None  # unticked: false, or not a boolean
    number = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(
        value) and (field.kind == "number" or float(value).is_integer())
    if not number:
        return None
    return str(int(value)) if field.kind == "integer" else json.dumps(value)


def _number(raw: str, integer: bool) -> int | float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    if integer:
        return int(value) if value.is_integer() else None
    return int(value) if value.is_integer() and "." not in raw and "e" not in raw.lower() else value


def _json(raw: str, path: str, problems: list[dict[str, str]]) -> Any:
    """A JSON text area, read by the API's rules (no NaN, no key twice in one object)."""
    try:
        return json_value(raw, "the text")
    except RuleBroken as exc:
        problems.append({"message": str(exc), "field_path": path})
        return None

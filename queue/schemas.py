"""JSON Schema (Draft 2020-12) at the boundary: a bad payload is refused before it is stored.

Violations name their field with an RFC 6901 JSON Pointer, so a form can show
each next to its field. A missing required property is pointed at where it
belongs (`/reason`), not at the object that lacks it.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from shardq.queue.errors import InvalidArgument, PayloadInvalid

MAX_VIOLATIONS = 50


def check_schema(schema: object, what: str) -> dict[str, Any]:
    """`schema` if it is a valid Draft 2020-12 schema (a JSON object); else InvalidArgument."""
    if not isinstance(schema, dict):
        raise InvalidArgument(
            f"{what}: a schema must be a JSON object, got {type(schema).__name__}"
        )
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidArgument(f"{what}: not a valid JSON Schema: {exc.message}") from None
    return schema


def validate(
    payload: Any, schema: dict[str, Any] | None, what: str,
    summary: str = "payload validation failed",
) -> None:
    """Raise PayloadInvalid listing every violation; a None schema accepts anything.

    `summary` is the refusal's one-line title (the HTTP API's `error`)."""
    if schema is None:
        return
    validator = Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(payload), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        raise PayloadInvalid(what, [_violation(e) for e in errors[:MAX_VIOLATIONS]], summary)


def _violation(error: ValidationError) -> dict[str, str]:
    path = [str(p) for p in error.absolute_path]
    required = error.validator_value
    if error.validator == "required" and isinstance(error.instance, dict) and isinstance(
        required, list
    ):
        missing = next((name for name in required
                        if name not in error.instance and error.message.startswith(repr(name))),
                       None)
        if missing is not None:
            path.append(str(missing))
    return {"message": error.message, "field_path": pointer(path)}


def pointer(parts: list[str]) -> str:
    """An RFC 6901 JSON Pointer: "" for the whole document, `~` and `/` escaped."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)

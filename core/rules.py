"""The input rules: every check a value meets on its way into shardq, in one module.

`Client`, `AsyncClient`, the CLI, the HTTP API and a workflow's
`ctx.signal_external` call these functions, so a name, a key, a payload or a
bound is checked by one definition whoever sends it. What each
checks:

- names (workflows, steps, timers, signals, tenants): one character set,
  `NAME_PATTERN`; signal names outside the reserved prefixes;
- text PostgreSQL stores: no NUL, no lone surrogate (`check_text`), also inside
  JSON values (`to_json`);
- sizes: `Limits` (inputs, payloads, idempotency keys), per client or worker;
- JSON Schema (Draft 2020-12): `check_schema` for a definition, `validate` for
  a value, each violation named by an RFC 6901 pointer;
- a signal as a whole: `check_signal` (name, key, payload: each checked once);
- the client's other arguments: workflow ids, labels (decision ids, actors),
  waits, page sizes, age filters;
- what a front end reads from bytes: `idempotency_key` and `json_value`
  (RuleBroken, a usage error: an exit code, a 400).

`names.py`, `limits.py`, `encoding.py` and `schemas.py` re-export their part
of this module for the imports that name them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from shardq.core.errors import InvalidArgument, NotSerializable, PayloadInvalid
from shardq.core.flow import RateLimit
from shardq.core.models import State

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

# -- names and text ----------------------------------------------------------------

NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}"
"""A letter or underscore, then letters, digits, `_ . : -`; at most 128 characters."""

_NAME = re.compile(NAME_PATTERN)

RESERVED_PREFIXES = ("shardq.", "shardq:", "__")
"""Signal names shardq keeps for itself: refused from senders and in definitions."""


def check_name(value: object, what: str) -> str:
    """Return `value` if it is a valid name, else raise InvalidArgument saying why."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} name must be a non-empty string, got {value!r}")
    if not _NAME.fullmatch(value):
        raise InvalidArgument(
            f"{what} name {value!r} is invalid: use letters, digits and _ . : - "
            "(starting with a letter or _), at most 128 characters"
        )
    return value


def check_text(value: str, what: str) -> str:
    """Return `value` if PostgreSQL can store it as text, else raise InvalidArgument.

    PostgreSQL text holds neither NUL nor lone surrogates (Python makes the latter from
    command-line bytes that are not UTF-8); refused here, the message names the field
    instead of a statement's portal parameter.
    """
    nul = value.find("\x00")
    if nul >= 0:
        raise InvalidArgument(
            f"{what} contains a NUL character (\\u0000) at position {nul}, "
            "which PostgreSQL cannot store"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"{what} contains a lone surrogate ({value[exc.start]!a}) at position {exc.start}: "
            "not valid Unicode (was it given in another encoding than UTF-8?)"
        ) from None
    return value


def check_signal_name(value: object) -> str:
    """A valid signal name that is not reserved; else InvalidArgument."""
    name = check_name(value, "signal")
    if name.lower().startswith(RESERVED_PREFIXES):
        raise InvalidArgument(f"signal name {name!r} is reserved: names starting with "
                              f"{', '.join(RESERVED_PREFIXES)} belong to shardq")
    return name


# -- sizes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Bounds on what a caller may store, checked before anything is sent to a shard.

    A run's input is read by every claim of the run, and a signal's payload by
    every claim until it is consumed: without a bound a single caller could make
    each turn drag megabytes through the claim path. The defaults follow what
    webhook and queue services accept (256 KiB messages, 255-character
    idempotency keys); an application with other needs passes its own `Limits`
    to its `Client` (and the same to its workers).
    """

    max_input_bytes: int = 1 << 20
    """A run's input, as JSON text (1 MiB)."""
    max_payload_bytes: int = 256 << 10
    """A signal's payload, as JSON text (256 KiB)."""
    max_idempotency_key: int = 255
    """Characters of an idempotency key."""

    def __post_init__(self) -> None:
        for name in ("max_input_bytes", "max_payload_bytes", "max_idempotency_key"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name} must be a positive integer, got {value!r}")

    def check_input(self, encoded: str, what: str) -> str:
        return _within(encoded, self.max_input_bytes, what, "max_input_bytes")

    def check_payload(self, encoded: str, what: str) -> str:
        return _within(encoded, self.max_payload_bytes, what, "max_payload_bytes")

    def check_key(self, key: str) -> str:
        if len(key) > self.max_idempotency_key:
            raise InvalidArgument(
                f"idempotency_key is {len(key)} characters long; at most "
                f"{self.max_idempotency_key} (Limits.max_idempotency_key)"
            )
        return key


def _within(encoded: str, bound: int, what: str, setting: str) -> str:
    # json.dumps escapes everything beyond ASCII, so characters are bytes here.
    if len(encoded) > bound:
        raise InvalidArgument(
            f"{what} is {len(encoded):,} bytes of JSON; at most {bound:,} (Limits.{setting})"
        )
    return encoded


# -- JSON values -------------------------------------------------------------------

_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|d[89a-f])")
"""How NUL and surrogates (paired ones too) look in json.dumps' ASCII output."""


def to_json(value: Any, what: str) -> str:
    """Encode `value` as the database will store it, or say clearly why not."""
    try:
        text = json.dumps(value, allow_nan=False)
    except RecursionError:
        raise NotSerializable(f"{what} is nested too deeply to be stored as JSON") from None
    except (TypeError, ValueError) as exc:
        raise NotSerializable(f"{what} is not JSON-serialisable: {exc}") from None
    # The text search is cheap; the walk that names the offending string only runs on a hit.
    if _SUSPECT_ESCAPE.search(text):
        _check_strings(value, what)
    return text


def _check_strings(value: Any, what: str) -> None:
    """Raise InvalidArgument naming the first string PostgreSQL's jsonb cannot hold.

    Iterative: `value` may be nested as deeply as json.dumps allows.
    """
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            check_text(item, f"{what}: the string at {path}")
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    key = json.dumps(key)  # noqa: PLW2901 - json.dumps turns it into this
                check_text(key, f"{what}: a key at {path}")
                simple = key.isascii() and key.isidentifier()
                stack.append((child, f"{path}.{key}" if simple else f"{path}[{json.dumps(key)}]"))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))


def payload_json(value: Any, what: str, limits: Limits) -> str:
    """A payload (a signal's, an update's or query's argument, a decision's, a value under
    review) as the JSON text to store: storable, within `limits.max_payload_bytes`."""
    return limits.check_payload(to_json(value, what), what)


# -- JSON Schema ---------------------------------------------------------------------

MAX_VIOLATIONS = 50


def check_schema(schema: object, what: str) -> dict[str, Any]:
    """`schema` if it is a valid Draft 2020-12 schema (a JSON object); else InvalidArgument."""
    if not isinstance(schema, dict):
        raise InvalidArgument(
            f"{what}: a schema must be a JSON object, got {type(schema).__name__}"
        )
    # Imported here: jsonschema is a twentieth of a second to import, and most
    # processes (a CLI command, a worker of workflows without schemas) never use it.
    from jsonschema import Draft202012Validator  # noqa: PLC0415
    from jsonschema.exceptions import SchemaError  # noqa: PLC0415

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
    from jsonschema import Draft202012Validator  # noqa: PLC0415 - see check_schema

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


# -- signals -------------------------------------------------------------------------


def check_key(key: object, limits: Limits) -> str | None:
    """An idempotency key as given (None: no key): a non-empty, storable string within
    `limits.max_idempotency_key` characters."""
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip():
        raise InvalidArgument("idempotency_key must be a non-empty string when given")
    return limits.check_key(check_text(key, "idempotency_key"))


def check_signal(
    name: str, payload: Any, key: str | None, limits: Limits
) -> tuple[str, str, str | None]:
    """(name, payload JSON, key) of a signal, checked as every entry point checks them:
    the name (not reserved), the key, then the payload (storable, within the bound)."""
    check_signal_name(name)
    checked_key = check_key(key, limits)
    return name, payload_json(payload, f"payload of signal {name!r}", limits), checked_key


# -- the client's other arguments ------------------------------------------------------

MAX_WORKFLOW_ID = 512
"""Characters of a workflow id."""
MAX_LABEL = 255
"""Characters of a decision id or an actor."""
MAX_WAIT = 600.0
"""Seconds an update call may wait for its outcome."""
MAX_AGE_FILTER = 10 * 366 * 86400.0
"""Seconds an age filter (`waited_s`) may name."""


def check_workflow_id(workflow_id: object) -> str:
    """A workflow id: a storable string of 1..512 characters."""
    if not isinstance(workflow_id, str) or not workflow_id or len(workflow_id) > MAX_WORKFLOW_ID:
        raise InvalidArgument(f"workflow_id must be a 1..{MAX_WORKFLOW_ID} character string, "
                              f"got {workflow_id!r}")
    return check_text(workflow_id, "workflow_id")


def check_label(value: object, what: str) -> str:
    """A decision id or an actor: a non-empty string of at most 255 characters."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_LABEL:
        raise InvalidArgument(f"{what} must be a non-empty string of at most {MAX_LABEL} "
                              f"characters, got {value!r}")
    return check_text(value, what)


MAX_PRIORITY = 9
"""Priorities run 0 (the default) to 9, higher claimed first. Few on purpose: a claim
asks each level present for its due runs (docs/flow-control.md)."""


def parse_moment(value: object, what: str = "") -> datetime:
    """An ISO 8601 time with its offset (a time without one means a different moment on
    each machine that reads it, so it is refused rather than guessed)."""
    prefix = f"{what}: " if what else ""
    try:
        parsed = datetime.fromisoformat(value)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        raise InvalidArgument(f"{prefix}{value!r} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise InvalidArgument(f"{prefix}{value!r} has no offset: write it with one "
                              "(e.g. 2026-12-01T00:00:00Z)")
    return parsed


def check_priority(value: object) -> int:
    """A run's priority: a whole number within 0..MAX_PRIORITY (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PRIORITY:
        raise InvalidArgument(f"priority must be a whole number within 0..{MAX_PRIORITY} "
                              f"(higher is claimed first), got {value!r}")
    return value


def check_state(value: object) -> State | None:
    """A filter's run state (None: any): one of State's values."""
    if value is None or isinstance(value, State):
        return value
    if not isinstance(value, str) or value not in {s.value for s in State}:
        raise InvalidArgument(f"state must be one of {', '.join(s.value for s in State)}, "
                              f"got {value!r:.40}")
    return State(value)


MAX_CONCURRENCY_KEY = 255
"""Characters of a concurrency key: it is stored on every task row of its runs."""
MAX_CONCURRENCY_LIMIT = 1_000_000
"""The largest concurrency limit: beyond it a limit is no limit, and a typo."""

MAX_RATE = 1_000_000
"""The most steps a rate limiter lets start per period."""

MAX_RATE_PERIOD_S = 31_536_000.0
"""The longest period of a rate limiter: a year."""

MAX_TENANT_WEIGHT = 1000
"""The largest tenant weight: a claim gives every tenant it visits at least one run, so
a ratio beyond this is not kept anyway (docs/flow-control.md)."""


def check_concurrency_key(key: object) -> str:
    """A concurrency key: a non-empty string of at most MAX_CONCURRENCY_KEY characters."""
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_CONCURRENCY_KEY:
        shown = f"{key[:40]!r}... ({len(key)} characters)" if isinstance(key, str) and len(
            key) > MAX_CONCURRENCY_KEY else repr(key)
        raise InvalidArgument(f"concurrency key must be a non-empty string of at most "
                              f"{MAX_CONCURRENCY_KEY} characters, got {shown}")
    return check_text(key, "concurrency key")


def check_concurrency_limit(limit: object) -> int:
    """A concurrency limit: a whole number within 1..MAX_CONCURRENCY_LIMIT (not a bool)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not (
            1 <= limit <= MAX_CONCURRENCY_LIMIT):
        raise InvalidArgument(f"concurrency limit must be a whole number within "
                              f"1..{MAX_CONCURRENCY_LIMIT}, got {limit!r}")
    return limit


def check_tenant_weight(weight: object) -> int:
    """A tenant's weight in fair claims: a whole number within 1..MAX_TENANT_WEIGHT (not a
    bool)."""
    if isinstance(weight, bool) or not isinstance(weight, int) or not (
            1 <= weight <= MAX_TENANT_WEIGHT):
        raise InvalidArgument(f"tenant weight must be a whole number within "
                              f"1..{MAX_TENANT_WEIGHT}, got {weight!r}")
    return weight


def check_rate_limit(rate: object, per: object, burst: object) -> RateLimit:
    """A rate limiter's numbers: `rate` and `burst` whole numbers within 1..MAX_RATE (not
    bools), `per` a number of seconds above 0 and up to MAX_RATE_PERIOD_S."""
    if isinstance(per, bool) or not isinstance(per, int | float) or not (
            0 < per <= MAX_RATE_PERIOD_S):  # NaN fails both comparisons
        raise InvalidArgument(f"rate limit period must be a number of seconds above 0 and "
                              f"at most {MAX_RATE_PERIOD_S:g}, got {per!r}")
    return RateLimit(_rate_count(rate, "rate"), float(per), _rate_count(burst, "burst"))


def _rate_count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RATE:
        raise InvalidArgument(f"rate limit {what} must be a whole number within "
                              f"1..{MAX_RATE}, got {value!r}")
    return value


def check_concurrency(value: object) -> tuple[str, int]:
    """A start's concurrency: a (key, limit) pair, each checked."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise InvalidArgument(f"concurrency must be a (key, limit) pair, got {value!r}")
    return check_concurrency_key(value[0]), check_concurrency_limit(value[1])


def check_wait(wait: object) -> float:
    """Seconds to wait for an update's outcome: a number within 0..MAX_WAIT."""
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= MAX_WAIT:
        raise InvalidArgument(f"wait must be a number of seconds within 0..{MAX_WAIT:g}, got "
                              f"{wait!r}")
    return float(wait)


def check_page_size(limit: object, largest: int) -> int:
    """A page size within 1..largest."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= largest:
        raise InvalidArgument(f"page size must be within 1..{largest}, got {limit!r}")
    return limit


def check_waited(waited_s: object) -> float:
    """An age filter in seconds, within 0..MAX_AGE_FILTER."""
    if isinstance(waited_s, bool) or not isinstance(waited_s, int | float) or not (
        0 <= waited_s <= MAX_AGE_FILTER
    ):
        raise InvalidArgument(f"waited_s must be within 0..{MAX_AGE_FILTER:g} seconds")
    return float(waited_s)


# -- what a front end reads from bytes -----------------------------------------------------


class RuleBroken(InvalidArgument):
    """What the caller sent breaks a rule of this module (a usage error)."""


def idempotency_key(value: str | bytes | None, source: str) -> str | None:
    """The key `source` carries; None when absent; RuleBroken when present but unusable.

    Empty or blank is refused, never read as "no key" (that would turn
    exactly-once into at-least-once), and so are bytes that are not UTF-8.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise RuleBroken(f"{source} is not valid UTF-8") from None
    if not value.strip():
        raise RuleBroken(f"{source} is empty: leave it out for no key")
    return value


def json_value(raw: str | bytes, what: str) -> Any:
    """Strict JSON (no NaN or Infinity, no number out of a float's range, no key twice in
    one object, UTF-8 only), None for an empty or blank text; RuleBroken saying what is
    wrong.

    A repeated key is refused rather than read as its last value (what json.loads
    does): the sender meant one of them, and a reader that takes the first (another
    parser, a proxy, an audit log) would act on a different request than we stored.
    """
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RuleBroken(f"{what} is not UTF-8 (byte {exc.start}: {exc.reason})") from None
    if not raw.strip():
        return None
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite,
                          object_pairs_hook=_unique_keys)
    except RecursionError:
        raise RuleBroken(f"{what} is nested too deeply") from None
    except _RepeatedKey as exc:
        raise RuleBroken(f"{what} repeats the key {exc.key!r} in one object") from None
    except ValueError as exc:  # json.JSONDecodeError too
        raise RuleBroken(f"{what} is not valid JSON: {exc}") from None


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(number: str) -> float:
    parsed = float(number)
    if not math.isfinite(parsed):
        raise ValueError(f"the number {number} is out of range")
    return parsed

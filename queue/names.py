"""Names of workflows, steps, timers and signals: one documented character set."""

from __future__ import annotations

import re

from shardq.queue.errors import InvalidArgument

NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}"
"""A letter or underscore, then letters, digits, `_ . : -`; at most 128 characters."""

_NAME = re.compile(NAME_PATTERN)


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


RESERVED_PREFIXES = ("shardq.", "shardq:", "__")
"""Signal names shardq keeps for itself: refused from senders and in definitions."""


def check_signal_name(value: object) -> str:
    """A valid signal name that is not reserved; else InvalidArgument."""
    name = check_name(value, "signal")
    if name.lower().startswith(RESERVED_PREFIXES):
        raise InvalidArgument(f"signal name {name!r} is reserved: names starting with "
                              f"{', '.join(RESERVED_PREFIXES)} belong to shardq")
    return name

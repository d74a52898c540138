"""Values as the database will store them: JSON text, or a clear reason why not."""

from __future__ import annotations

import json
import re
from typing import Any

from shardq.queue.errors import NotSerializable
from shardq.queue.names import check_text

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

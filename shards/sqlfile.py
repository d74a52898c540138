"""Load named queries from a .sql file.

A query file is plain SQL split by header lines `-- name: <identifier>`; the
text up to the next header is that query. Keeping statements in .sql files
means a reader finds every statement touching a table with one grep, and
editors highlight them as SQL.
"""

from __future__ import annotations

import re
from importlib import resources

_HEADER = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_queries(text: str, *, source: str) -> dict[str, str]:
    """Map each `-- name:` header to the statement under it."""
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


def load_queries(package: str, filename: str) -> dict[str, str]:
    """The named queries of `filename` shipped inside `package` (e.g. shardq.store)."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    return parse_queries(text, source=f"{package}/{filename}")

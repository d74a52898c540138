"""Every named query is used by its package's code, and every use names a query that exists."""

from __future__ import annotations

import re

import pytest

from shardq.shards.sqlfile import load_queries

from .support import ROOT

USE = re.compile(r'SQL\["([a-z_]+)"\]')


@pytest.mark.parametrize(
    ("package", "sql_file", "code"),
    [
        ("shardq.queue", "queries.sql", ["queue/store.py"]),
        ("shardq.shards", "queries.sql", ["shards/migrations.py"]),
    ],
)
def test_queries_and_their_uses_match(package: str, sql_file: str, code: list[str]) -> None:
    defined = set(load_queries(package, sql_file))
    used = {name for path in code for name in USE.findall((ROOT / path).read_text())}
    assert used - defined == set(), "code names queries the .sql file lacks"
    assert defined - used == set(), "the .sql file has queries no code runs"

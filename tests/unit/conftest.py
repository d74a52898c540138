"""Unit tests run without PostgreSQL: asking for a database fixture here is a mistake."""

from __future__ import annotations

import pytest

DATABASE_FIXTURES = frozenset({
    "pg_server", "shard_urls", "migrated_map", "shard_map", "fresh_databases", "pools",
    "start_worker",
})


@pytest.fixture(autouse=True)
def _no_database(request: pytest.FixtureRequest) -> None:
    used = DATABASE_FIXTURES & set(request.fixturenames)
    if used:
        pytest.fail(f"a unit test may not use the database ({', '.join(sorted(used))}): "
                    "move it to tests/store or tests/integration")

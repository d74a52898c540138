"""Shard URLs keep their spelling when a password is taken out or hidden: a Unix socket
URL with no host part (`postgresql:///db?host=/run/postgresql`) must stay one."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from shardq.shards.config import redact, without_password


@pytest.mark.parametrize(("url", "stored", "shown"), [
    ("postgresql:///db?host=/run/postgresql", "postgresql:///db?host=/run/postgresql",
     "postgresql:///db?host=/run/postgresql"),
    ("postgresql:///db?host=/run/postgresql&password=s3cret",
     "postgresql:///db?host=/run/postgresql",
     "postgresql:///db?host=/run/postgresql&password=***"),
    ("postgres:///db?host=%2Frun%2Fpostgresql&port=5433",
     "postgres:///db?host=%2Frun%2Fpostgresql&port=5433",
     "postgres:///db?host=%2Frun%2Fpostgresql&port=5433"),
    ("postgresql://app:s3cret@db1:5432/q", "postgresql://app@db1:5432/q",
     "postgresql://app:***@db1:5432/q"),
    ("postgresql://@/db?host=/tmp", "postgresql://@/db?host=/tmp", "postgresql://@/db?host=/tmp"),
])
def test_a_url_keeps_its_spelling_without_its_password(url: str, stored: str,
                                                       shown: str) -> None:
    assert without_password(url) == stored
    assert redact(url) == shown
    params = conninfo_to_dict(stored)  # libpq still reads it, to the same database
    assert params["dbname"] in ("db", "q") and "password" not in params

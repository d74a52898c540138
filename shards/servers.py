"""PostgreSQL servers the tools create shard databases on (tests, benchmarks, demo).

Not used by the engine itself: it only ever gets shard URLs from the map.
"""

from __future__ import annotations

from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The server every development and CI machine has (trust authentication)."""


def answers(dsn: str) -> bool:
    """True when a server accepts a connection at `dsn` within a few seconds."""
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def database_url(admin_dsn: str, dbname: str) -> str:
    """The admin DSN's server and credentials, pointed at `dbname`, as a postgresql:// URL.

    A Unix-socket host (a folder) goes in the query string, where libpq takes it.
    """
    params = conninfo_to_dict(admin_dsn)
    host, port = params.get("host"), params.get("port")
    user, password = params.get("user"), params.get("password")
    auth = ""
    if user:
        secret = f":{quote(str(password), safe='')}" if password else ""
        auth = f"{quote(str(user), safe='')}{secret}@"
    name = quote(dbname, safe="")
    if host and not str(host).startswith("/"):
        return f"postgresql://{auth}{host}{':' + str(port) if port else ''}/{name}"
    extra = [f"host={quote(str(host))}"] if host else []
    extra += [f"port={port}"] if port else []
    return f"postgresql://{auth}/{name}" + ("?" + "&".join(extra) if extra else "")

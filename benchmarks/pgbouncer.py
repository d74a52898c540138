"""A throw-away PgBouncer in transaction mode in front of a PostgreSQL server, for the
`wake` scenario's run through a pooler and for the tests that run a deployment behind
one (tests/acceptance/test_pgbouncer.py): Debian's `pgbouncer` on a free port of
127.0.0.1, every database by its own name, trust authentication as the server has,
stopped and its folder removed on the way out."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

from shardq.shards.config import through_pooler

START_S = 15.0
"""How long it may take to answer."""


def pgbouncer_binary() -> str | None:
    """Debian's pgbouncer (/usr/sbin is off a non-root PATH), or None."""
    found = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    return found if Path(found).exists() else None


@dataclass(frozen=True)
class Pooler:
    address: str
    """postgresql://127.0.0.1:PORT: what SHARDQ_POOLER names."""
    admin: str
    """The user its admin console takes (the server's)."""

    def clients(self) -> set[tuple[str, str]]:
        """The (database, application_name) of each client connection it holds now (its
        admin console, which speaks the simple query protocol only)."""
        console = self.address.replace("://", f"://{self.admin}@") + "/pgbouncer"
        with psycopg.connect(console, autocommit=True,
                             cursor_factory=psycopg.ClientCursor) as conn:
            cur = conn.execute("SHOW CLIENTS")
            names = [c.name for c in cur.description or ()]
            return {(row[names.index("database")], row[names.index("application_name")])
                    for row in cur.fetchall()}


@contextmanager
def running_pgbouncer(server_url: str, routes: Mapping[str, str] | None = None
                      ) -> Iterator[Pooler]:
    """PgBouncer in front of the server `server_url` (any database of it) reaches, and of
    the servers `routes` names for some databases (database name -> a URL of its server)."""
    binary = pgbouncer_binary()
    if binary is None:
        raise RuntimeError("Debian's pgbouncer is not installed (apt-get install pgbouncer)")
    server = conninfo_to_dict(server_url)
    user = str(server.get("user") or getpass.getuser())  # libpq's default: the OS user
    # Readable by the user it switches to: it refuses to run as root.
    folder = Path(tempfile.mkdtemp(prefix="shardq-pgbouncer-"))
    folder.chmod(0o777)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    (folder / "users.txt").write_text("".join(f'"{u}" ""\n' for u in sorted({user, "postgres"})))
    routed = "".join(
        f"{name} = host={where.get('host') or '127.0.0.1'} port={where.get('port') or 5432}\n"
        for name, where in ((n, conninfo_to_dict(u)) for n, u in (routes or {}).items()))
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n" + routed +
        f"* = host={server.get('host') or '127.0.0.1'} port={server.get('port') or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        f"admin_users = {user}\npool_mode = transaction\n"
        "max_client_conn = 1000\ndefault_pool_size = 20\n")
    for path in folder.iterdir():
        path.chmod(0o644)
    as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
    log = folder / "pgbouncer.err"
    with log.open("wb") as err:
        proc = subprocess.Popen([binary, *as_user, str(folder / "pgbouncer.ini")],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    pooler = Pooler(f"postgresql://127.0.0.1:{port}", user)
    try:
        _wait_until_it_answers(proc, through_pooler(server_url, pooler.address), log)
        yield pooler
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _wait_until_it_answers(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + START_S
    while True:
        try:
            with psycopg.connect(url, prepare_threshold=None, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
                return
        except psycopg.OperationalError as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"pgbouncer did not answer: {log.read_text()[-1000:]}") from exc
            time.sleep(0.1)

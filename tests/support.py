"""Helpers tests import (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import tuple_row

from shardq.shards.config import ShardMap
from shardq.shards.routing import bucket_for

from . import warm_cli

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


def product_folders() -> list[Path]:
    """The folders the wheel ships (pyproject's [tool.hatch.build.targets.wheel]
    only-include), as paths of this checkout."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["only-include"]
    return [ROOT / name for name in listed if (ROOT / name).is_dir()]


def query_files() -> list[Path]:
    """Every `queries.sql` the wheel ships: a new one is found without being listed."""
    return sorted(p for folder in product_folders() for p in folder.rglob("queries.sql"))


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `shardq` as a user would, in a separate process (`stdin` is its input): one
    forked from a warm server (tests/warm_cli.py), or a fresh interpreter with
    SHARDQ_TEST_FRESH_CLI=1."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    full_env.update(env or {})
    if os.environ.get("SHARDQ_TEST_FRESH_CLI") != "1":
        return warm_cli.run(list(args), full_env, ROOT, stdin, timeout)
    return subprocess.run(
        [sys.executable, "-m", "shardq.bin.cli", *args],
        check=False, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=ROOT,
        input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def wait_until(predicate: Callable[[], T | None], *, timeout: float = 10.0, what: str = "") -> T:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.01)


def rows(url: str, query: str, *params: object) -> list[tuple[Any, ...]]:
    """Run a read-only query on one shard database and return plain tuples."""
    with psycopg.connect(url) as conn:
        return conn.execute(query, params).fetchall()

def seq_scans(conn: psycopg.Connection[Any], tables: Sequence[str]) -> dict[str, int]:
    """The sequential scans of these shardq tables so far, this session's included (its
    counters flushed first): read before and after a statement to count its own."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return dict(conn.execute(
        "SELECT relname::text, seq_scan FROM pg_stat_user_tables "
        "WHERE schemaname = 'shardq' AND relname = ANY(%s)", [list(tables)]).fetchall())


def rows_read(conn: psycopg.Connection[Any]) -> int:
    """Rows this session read from shardq's tables and indexes and has not reported yet
    (the server reports them at most once a second): read before and after a statement,
    in one transaction, to count its own."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(
            "SELECT sum(pg_stat_get_xact_tuples_fetched(c.oid)"
            " + pg_stat_get_xact_tuples_returned(c.oid)) FROM pg_class c"
            " WHERE c.relnamespace = 'shardq'::regnamespace").fetchone()
    return int(row[0] or 0) if row else 0


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[Any]]:
    """`call` on a thread of its own, started; the list receives what it returned or
    the exception it raised (join the thread before reading it)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def waiting_on_a_lock(url: str, holder_pid: int) -> bool:
    """Whether a session other than `holder_pid` waits for a lock in `url`'s database."""
    found = rows(url, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                      "WHERE NOT l.granted AND a.datname = current_database() AND l.pid <> %s",
                 holder_pid)
    return int(found[0][0]) > 0


def age(shard_map: ShardMap, table: str, column: str, seconds: float) -> None:
    """Move `column` of every row of shardq.`table` `seconds` into the past, on every shard.

    Time in shardq is the database's now() compared with stored times, so
    ageing the stored times is the clock moving on for those rows: a test of a
    bound (stale, overdue, due) passes it without sleeping.
    """
    statement = sql.SQL("UPDATE shardq.{} SET {} = {} - make_interval(secs => %s)").format(
        sql.Identifier(table), sql.Identifier(column), sql.Identifier(column))
    for shard in shard_map.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute(statement, [seconds])


def all_rows(shard_map: ShardMap, query: str, *params: object) -> list[tuple[Any, ...]]:
    """The same query on every shard, results concatenated."""
    return [r for shard in shard_map.shards for r in rows(shard.url, query, *params)]


class Daemon:
    """A `shardq` daemon as its own process; its output goes to files so no pipe can fill."""

    def __init__(
        self, name: str, args: Sequence[str], folder: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.err_path = folder / f"{name}.err"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
        full_env.update({"PYTHONUNBUFFERED": "1", **(env or {})})
        with (folder / f"{name}.out").open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "shardq.bin.cli", *args],
                env=full_env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            )

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        """Until `text` appears on its stderr; fails the test if it exits first."""
        deadline = time.monotonic() + timeout
        while text not in self.stderr():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode} before "
                                     f"{text!r}:\n{self.stderr()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {text!r} after {timeout} s:\n"
                                     f"{self.stderr()}")
            time.sleep(0.02)

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def start_api(
    daemons: Callable[..., Daemon], shard_map: ShardMap, folder: Path,
    tokens: dict[str, str], *extra: str,
) -> tuple[str, Daemon]:
    """A `shardq serve` process over `shard_map` for `tokens` ({token: tenant}), serving
    the tests' app (tests/app.py): its base URL (http://127.0.0.1:PORT) once it answers,
    and the process."""
    from shardq.bin.web.tokens import hash_token

    tokens_file = folder / "tokens"
    tokens_file.write_text("".join(f"{tenant} {hash_token(token)}\n"
                                   for token, tenant in tokens.items()))
    port = free_port()
    server = daemons(["--shards", ",".join(s.url for s in shard_map.shards), "serve", "--app",
                      "shardq.tests.app:registry", "--port", str(port), "--tokens-file",
                      str(tokens_file), *extra])
    server.wait_for("shardq API on")
    base = f"http://127.0.0.1:{port}"
    wait_for_health(base, 200)
    return base, server


def wait_for_health(base: str, status: int, *, timeout: float = 30.0) -> None:
    """Until the API at `base` (http://HOST:PORT) answers its /healthz with `status`:
    200 once it serves every shard, 503 while one is down."""
    import httpx

    def answers() -> bool:
        try:
            return httpx.get(f"{base}/api/shardq/healthz", timeout=5).status_code == status
        except httpx.TransportError:
            return False

    wait_until(answers, timeout=timeout, what=f"the API to answer /healthz with {status}")


class TcpProxy:
    """A TCP forwarder to a PostgreSQL server that a test can cut, freeze and restore.

    `stop()` refuses new connections and resets the open ones, as a host that
    went away would look to a client; `start()` serves the same port again.
    `freeze()` stops moving bytes and closes nothing: connections open and new
    ones are accepted (this kernel acknowledges them), nothing reaches the server
    and nothing comes back, as with a frozen server or a stuck pooler (TCP
    keepalives see a healthy peer); `freeze_open()` does that to the connections
    open now only, new ones flowing (a stale NAT entry, a pooler's stuck client: the
    server answers others); `thaw()` moves what was held back and resumes.
    """

    def __init__(self, host: str, port: int, *, forward: bool = True) -> None:
        """`forward=False`: a host that accepts connections and never answers."""
        self._target = (host, port)
        self._forward = forward
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._pairs: list[threading.Event] = []  # one per connection: flowing
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port: int = probe.getsockname()[1]
        probe.close()

    @classmethod
    def to(cls, url: str) -> TcpProxy:
        """A started proxy to the server of `url` (a Unix socket folder or a TCP host)."""
        params = conninfo_to_dict(url)
        return cls(str(params.get("host") or "127.0.0.1"),
                   int(params.get("port") or 5432)).start()

    def url(self, url: str) -> str:
        """`url` with its host and port replaced by this proxy's."""
        params = conninfo_to_dict(url)
        user, password = params.get("user"), params.get("password")
        auth = (f"{quote(str(user))}{':' + quote(str(password)) if password else ''}@"
                if user else "")
        return f"postgresql://{auth}127.0.0.1:{self.port}/{quote(str(params['dbname']))}"

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def freeze(self) -> None:
        self._flowing.clear()

    def freeze_open(self) -> None:
        with self._lock:
            for pair in self._pairs:
                pair.clear()

    def thaw(self) -> None:
        with self._lock:
            for pair in self._pairs:
                pair.set()
        self._flowing.set()

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        self.thaw()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if not self._forward:
                with self._lock:
                    self._conns.append(client)
                continue
            try:
                server = _connect(*self._target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._conns += [client, server]
                pair = threading.Event()
                pair.set()
                self._pairs.append(pair)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pipe, args=(a, b, (self._flowing, pair)),
                                 daemon=True).start()


def _connect(host: str, port: int) -> socket.socket:
    """TCP to host:port; a folder for host is PostgreSQL's Unix socket (embedded servers)."""
    if not host.startswith("/"):
        return socket.create_connection((host, port))
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(f"{host}/.s.PGSQL.{port}")
    except OSError:
        sock.close()
        raise
    return sock


def _pipe(source: socket.socket, sink: socket.socket,
          flowing: tuple[threading.Event, ...]) -> None:
    def flow() -> None:
        for event in flowing:
            event.wait()

    with contextlib.suppress(OSError):
        while True:
            flow()
            if not (data := source.recv(65536)):
                break
            flow()  # read while flowing, held while frozen
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""A scrape: (metric name, sorted labels) -> value."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int, timeout: float = 10.0) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def allow_connections(urls: list[str], allowed: bool) -> None:
    """Make shard databases refuse new connections (ending those they have), or take them:
    a shard that is down, or out of slots, as far as any process can tell."""
    with psycopg.connect(urls[0], dbname="postgres", autocommit=True) as admin:
        for url in urls:
            name = str(conninfo_to_dict(url)["dbname"])
            admin.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                sql.Identifier(name), sql.Literal(allowed)))
            if not allowed:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = %s AND pid <> pg_backend_pid()", [name])


def keys_on(shard_map: ShardMap, index: int, workflow: str, prefix: str, count: int = 1,
            *, tenant: str = "default") -> list[str]:
    """`count` workflow ids `<prefix>-<n>` whose runs of `workflow` live on shard `index`."""
    shard = shard_map.shards[index]
    found = (k for k in (f"{prefix}-{i}" for i in itertools.count())
             if shard_map.for_bucket(bucket_for(tenant, workflow, k)) == shard)
    return list(itertools.islice(found, count))


def key_on(shard_map: ShardMap, index: int, workflow: str, prefix: str,
           *, tenant: str = "default") -> str:
    """One workflow id `<prefix>-<n>` whose run of `workflow` lives on shard `index`."""
    return keys_on(shard_map, index, workflow, prefix, 1, tenant=tenant)[0]


def schema_before(schema: Path, into: Path, version: int, functions: Sequence[str]) -> Path:
    """A copy of the schema folder as it was before migration `version`: the later
    migrations and the named function files (those they brought) left out."""
    shutil.copytree(schema, into)
    for later in into.glob("[0-9][0-9][0-9][0-9]_*.sql"):
        if int(later.name[:4]) >= version:
            later.unlink()
    for name in functions:
        (into / "functions" / f"{name}.sql").unlink()
    return into

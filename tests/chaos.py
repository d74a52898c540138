"""Fault injection for process tests: a PostgreSQL server behind a network path the test owns.

`FaultableServer.start()` initialises a PostgreSQL server of its own from the local
installation's binaries (`/usr/lib/postgresql/*/bin`, run as the `postgres` OS user), inside
a network namespace created for it. A second namespace is the router between this one and
the server's: two veth pairs, on one /29 of 10.213.77.0/24 (checked unused first; traffic
never leaves the machine). The server listens on its namespace's address only (plus a Unix
socket in its folder):

- `url(db)`: the path under test, TCP through the router; the daemons use it.
- `local_url(db)`: the Unix socket, which no network fault touches; the test observes and
  administers the server through it.

Faults:

- `silence()` / `heal()`: the router drops every packet it would forward, both ways, and
  resets nothing (a `tbf` qdisc whose bucket no packet fits, on both of its interfaces;
  this kernel has no `netem`). An open connection's `recv` blocks and a new `connect` times
  out, as behind a dead router or a firewall that discards: only TCP keepalives or a user
  timeout notice. The drop must happen on a hop between the ends: a packet dropped by the
  sender's own egress qdisc is a local drop its kernel sees, and it fails the connection
  with ETIMEDOUT within about 8 s, which is no test of keepalives.
- `freeze()` / `thaw()`: SIGSTOP the postmaster and every backend, then SIGCONT them. The
  server's kernel still accepts connections and acknowledges packets, so TCP keepalives see
  a healthy peer and no statement reaches the server (a storage stall, a stuck pooler):
  only a client-side deadline notices. The test's own Unix-socket connections hang too.
- `restart("immediate" | "fast")`: `pg_ctl restart` inside the namespace.
- `read_only(True | False)`: `default_transaction_read_only` by ALTER SYSTEM and reload.
- `slow_url(db, delay_s)`: the same database behind a `DelayProxy` (userspace, in this
  process) that holds every chunk `delay_s` in each direction before passing it on. A slow
  path only: a userspace proxy ACKs at its kernel, so it cannot simulate silence.

Each server takes a slot (0..15) under an exclusive `flock`, so concurrent sessions (pytest
workers, another engineer's run) never share names; whatever a crashed earlier holder of the
slot left (namespace, veth, processes, folder) is removed first. `close()` removes it all.

`Load` drives a steady, paced mix over a 3-shard map (`steps3` jobs, `onboarding` targets and
`tenant_cancel` senders whose signals cross shards), `Ledger` checks afterwards that every run
completed exactly once and every signal landed exactly once, and `Watch` records when a
condition first held.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from shardq.client.client import Client
from shardq.shards.config import ShardMap
from shardq.shards.routing import bucket_for

NETWORK = ipaddress.IPv4Network("10.213.77.0/24")
SLOTS = 16
PORT = 5433
LOCK_DIR = Path(tempfile.gettempdir())
_TOOL_TIMEOUT = 30.0


class ChaosUnavailable(RuntimeError):
    """This machine cannot host a faultable server (no `ip netns`, `tc` or PostgreSQL)."""


def _run(*args: str, check: bool = True, timeout: float = _TOOL_TIMEOUT) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                          check=False, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()}")
    return done.stdout


def pg_bindir() -> Path:
    """The newest local PostgreSQL installation that has initdb and pg_ctl."""
    found = [b for b in Path("/usr/lib/postgresql").glob("*/bin")
             if all(os.access(b / n, os.X_OK) for n in ("initdb", "pg_ctl", "postgres"))]
    if not found:
        raise ChaosUnavailable("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    return max(found, key=lambda b: int(b.parent.name) if b.parent.name.isdigit() else 0)


def unavailable_reason() -> str | None:
    """Why fault injection cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "runuser"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    try:
        pg_bindir()
    except ChaosUnavailable as exc:
        return str(exc)
    probe = f"shqprobe{os.getpid() % 100000}"
    try:
        _run("ip", "netns", "add", probe)
    except (RuntimeError, OSError) as exc:
        return f"`ip netns add` fails: {exc}"
    try:
        _run("ip", "netns", "exec", probe, "ip", "link", "set", "lo", "up")
        _run("ip", "netns", "exec", probe, "tc", "qdisc", "replace", "dev", "lo", "root",
             "tbf", "rate", "8bit", "burst", "1", "limit", "1")
        _run("ip", "netns", "exec", probe, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    except (RuntimeError, OSError) as exc:
        return f"`tc qdisc ... tbf` or forwarding fails in a namespace: {exc}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


# -- the server ----------------------------------------------------------------------


@dataclass
class FaultableServer:
    """A PostgreSQL server in a network namespace of its own; see the module's docstring."""

    slot: int
    lock: Any
    bindir: Path
    folder: Path
    silenced: bool = False
    frozen: bool = False
    proxies: list[DelayProxy] = field(default_factory=list)

    # -- names ---------------------------------------------------------------------

    @property
    def netns(self) -> str:
        """The server's namespace."""
        return f"shqc{self.slot}"

    @property
    def router(self) -> str:
        """The namespace that forwards between this one and the server's: the faults' hop."""
        return f"shqc{self.slot}r"

    @property
    def host_veth(self) -> str:
        return f"shqc{self.slot}h"  # peer: router_up, in the router

    @property
    def router_up(self) -> str:
        return f"shqc{self.slot}a"

    @property
    def router_down(self) -> str:
        return f"shqc{self.slot}b"  # peer: server_veth, in the server's namespace

    @property
    def server_veth(self) -> str:
        return f"shqc{self.slot}n"

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        """This slot's /29: the host-router /30, then the router-server /30."""
        return list(NETWORK.subnets(new_prefix=29))[self.slot]

    @property
    def near(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network((self.subnet.network_address, 30))

    @property
    def far(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network((self.subnet.network_address + 4, 30))

    @property
    def address(self) -> str:
        """Where the server listens: its namespace's end of the far link."""
        return str(self.far.network_address + 2)

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    def url(self, dbname: str) -> str:
        """The path under test: TCP over the veth."""
        return f"postgresql://postgres@{self.address}:{PORT}/{dbname}"

    def local_url(self, dbname: str = "postgres") -> str:
        """The Unix socket, out of the faults' reach: for observing and administering."""
        return f"postgresql://postgres@/{dbname}?host={self.folder}&port={PORT}"

    # -- life ----------------------------------------------------------------------

    @classmethod
    def start(cls) -> FaultableServer:
        if reason := unavailable_reason():
            raise ChaosUnavailable(reason)
        bindir = pg_bindir()
        for slot in range(SLOTS):
            lock = (LOCK_DIR / f"shardq-chaos-{slot}.lock").open("w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            server = cls(slot, lock, bindir, LOCK_DIR / f"shardq-chaos-{slot}")
            try:
                server._clean_leftovers()
                server._make_network()
                server._init_and_start()
            except BaseException:
                server.close()
                raise
            return server
        raise ChaosUnavailable(f"all {SLOTS} chaos slots are taken")

    def close(self) -> None:
        """Stop the server and remove the proxies, qdiscs, namespace, veth and folder."""
        try:
            for proxy in self.proxies:
                proxy.close()
            with contextlib.suppress(OSError, ValueError):
                self.thaw()  # a stopped postmaster would not stop
            self._clean_leftovers()
        finally:
            self.lock.close()

    def _clean_leftovers(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("stop", "-m", "immediate", "-t", "10", check=False)
        namespaces = _run("ip", "netns", "list", check=False)
        for ns in (self.netns, self.router):
            if re.search(rf"^{ns}\b", namespaces, re.MULTILINE):
                for pid in _run("ip", "netns", "pids", ns, check=False).split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                _run("ip", "netns", "del", ns, check=False)
        if _run("ip", "link", "show", self.host_veth, check=False).strip():
            _run("ip", "link", "del", self.host_veth, check=False)  # and its route
        shutil.rmtree(self.folder, ignore_errors=True)

    def _make_network(self) -> None:
        # The /29 must be ours alone: no address or route of this namespace overlaps it.
        for line in _run("ip", "-o", "-4", "addr", "show").splitlines():
            found = re.search(r"inet (\S+)", line)
            if found and ipaddress.IPv4Interface(found.group(1)).network.overlaps(self.subnet):
                raise ChaosUnavailable(f"{self.subnet} is already in use here: {line.strip()}")
        for line in _run("ip", "-4", "route", "show").splitlines():
            prefix = line.split()[0]
            if prefix != "default" and ipaddress.IPv4Network(prefix, strict=False).overlaps(
                    self.subnet):
                raise ChaosUnavailable(f"{self.subnet} is already routed here: {line.strip()}")
        router = ("ip", "netns", "exec", self.router)
        server = ("ip", "netns", "exec", self.netns)
        _run("ip", "netns", "add", self.router)
        _run("ip", "netns", "add", self.netns)
        _run("ip", "link", "add", self.host_veth, "type", "veth", "peer", "name", self.router_up)
        _run("ip", "link", "set", self.router_up, "netns", self.router)
        _run(*router, "ip", "link", "add", self.router_down, "type", "veth", "peer", "name",
             self.server_veth)
        _run(*router, "ip", "link", "set", self.server_veth, "netns", self.netns)
        _run("ip", "addr", "add", f"{self.near.network_address + 1}/30", "dev", self.host_veth)
        _run("ip", "link", "set", self.host_veth, "up")
        _run(*router, "ip", "addr", "add", f"{self.near.network_address + 2}/30", "dev",
             self.router_up)
        _run(*router, "ip", "addr", "add", f"{self.far.network_address + 1}/30", "dev",
             self.router_down)
        for dev in (self.router_up, self.router_down):
            _run(*router, "ip", "link", "set", dev, "up")
        _run(*router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        _run(*server, "ip", "addr", "add", f"{self.address}/30", "dev", self.server_veth)
        _run(*server, "ip", "link", "set", self.server_veth, "up")
        _run(*server, "ip", "link", "set", "lo", "up")
        _run(*server, "ip", "route", "add", "default", "via", str(self.far.network_address + 1))
        _run("ip", "route", "add", str(self.far), "via", str(self.near.network_address + 2),
             "dev", self.host_veth)

    def _init_and_start(self) -> None:
        self.folder.mkdir(mode=0o700)
        shutil.chown(self.folder, "postgres", "postgres")
        _run("runuser", "-u", "postgres", "--", str(self.bindir / "initdb"), "-D",
             str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C",
             "--no-sync", timeout=120)
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nlisten_addresses = '{self.address}'\nport = {PORT}\n"
                f"unix_socket_directories = '{self.folder}'\n"
                "max_connections = 200\nshared_buffers = 32MB\nfsync = off\n"
                "full_page_writes = off\n"
            )
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"\nhost all all {self.near} trust\n")
        self._pg_ctl("start", "-l", str(self.log), "-t", "60")

    def _pg_ctl(self, *args: str, check: bool = True) -> str:
        # Inside the namespace: a postmaster pg_ctl starts listens there.
        return _run("ip", "netns", "exec", self.netns, "runuser", "-u", "postgres", "--",
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", *args,
                    check=check, timeout=90)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no server log: {exc})"

    # -- databases -----------------------------------------------------------------

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.local_url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.local_url(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))

    # -- faults --------------------------------------------------------------------

    def _qdisc(self, *args: str, check: bool = True) -> None:
        # On the router's interfaces, both directions: a drop there is a lost packet to
        # both ends, as on a real path. (A drop in a sender's own egress qdisc is not: its
        # kernel sees the local drop and fails the connection within seconds.)
        for dev in (self.router_up, self.router_down):
            _run("ip", "netns", "exec", self.router, "tc", "qdisc", *args[:1], "dev", dev,
                 *args[1:], check=check)

    def silence(self) -> None:
        """Drop every packet both ways; nothing is reset or refused."""
        self._qdisc("replace", "root", "tbf", "rate", "8bit", "burst", "1", "limit", "1")
        self.silenced = True

    def heal(self) -> None:
        """Remove the qdiscs: the path carries packets again."""
        self._qdisc("del", "root", check=False)
        self.silenced = False

    @contextlib.contextmanager
    def silent(self) -> Iterator[None]:
        self.silence()
        try:
            yield
        finally:
            self.heal()

    def _processes(self) -> list[int]:
        """The postmaster's pid, then its children's (backends and auxiliary processes)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = _run("pgrep", "-P", str(postmaster), check=False).split()
        return [postmaster, *(int(pid) for pid in children)]

    def freeze(self) -> None:
        """Stop every process of the server where it stands (SIGSTOP): it hangs."""
        for pid in self._processes():  # the postmaster first: it forks no new backend
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if not self.frozen:
            return
        for pid in reversed(self._processes()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = False

    @contextlib.contextmanager
    def hung(self) -> Iterator[None]:
        self.freeze()
        try:
            yield
        finally:
            self.thaw()

    def restart(self, mode: str) -> None:
        """`pg_ctl restart -m MODE`: every connection ends; crash recovery for `immediate`."""
        self._pg_ctl("restart", "-m", mode, "-t", "60", "-l", str(self.log))

    def running(self) -> bool:
        return "server is running" in self._pg_ctl("status", check=False)

    def ensure_running(self) -> None:
        if not self.running():
            self._pg_ctl("start", "-l", str(self.log), "-t", "60")

    def read_only(self, on: bool) -> None:
        """Every new transaction read-only (or not again), applied by a reload."""
        with psycopg.connect(self.local_url(), autocommit=True) as conn:
            if on:
                conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            else:
                conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
            conn.execute("SELECT pg_reload_conf()")
        want = "on" if on else "off"
        deadline = time.monotonic() + 10
        while True:
            with psycopg.connect(self.local_url(), autocommit=True) as conn:
                row = conn.execute("SHOW default_transaction_read_only").fetchone()
            if row is not None and row[0] == want:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"default_transaction_read_only still not {want}")
            time.sleep(0.05)

    def slow_url(self, dbname: str, delay_s: float) -> tuple[str, DelayProxy]:
        """A URL of `dbname` through a proxy delaying each direction by `delay_s`."""
        proxy = DelayProxy((self.address, PORT), delay_s)
        self.proxies.append(proxy)
        return f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname}", proxy

    def reset(self) -> None:
        """Undo every fault: a test's teardown, whatever state it failed in."""
        for proxy in self.proxies:
            proxy.close()
        self.proxies.clear()
        self.thaw()
        self.heal()
        self.ensure_running()
        with contextlib.suppress(psycopg.Error):
            self.read_only(False)


class DelayProxy:
    """A TCP forwarder that passes every chunk on `delay_s` after it arrived, in order.

    Setting `delay_s` to 0 makes it a plain forwarder. It is a slow path only: its kernel
    ACKs whatever arrives, so a stalled proxy still looks alive to TCP keepalives.
    """

    def __init__(self, target: tuple[str, int], delay_s: float) -> None:
        self.target = target
        self.delay_s = delay_s
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="delay-proxy").start()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        chunks: list[tuple[float, bytes]] = []
        ready = threading.Condition()
        done = False

        def writer() -> None:
            while True:
                with ready:
                    while not chunks and not done:
                        ready.wait()
                    if not chunks:
                        break
                    due, data = chunks.pop(0)
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    sink.sendall(data)
                except OSError:
                    return
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

        threading.Thread(target=writer, daemon=True).start()
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                with ready:
                    chunks.append((time.monotonic() + self.delay_s, data))
                    ready.notify()
        with ready:
            done = True
            ready.notify()


# -- load ---------------------------------------------------------------------------


def key_on(shard_map: ShardMap, index: int, workflow: str, base: str) -> str:
    """The first `base-N` whose run of `workflow` the map routes to shard `index`."""
    target = shard_map.shards[index]
    for n in range(10_000):
        key = f"{base}-{n}"
        if shard_map.for_bucket(bucket_for("default", workflow, key)) == target:
            return key
    raise AssertionError(f"no key routes {workflow} to shard {index}")


@dataclass
class _Call:
    workflow: str
    items: list[tuple[str, Any]]
    targets_for: int | None = None  # onboarding runs queued for this sender shard


class Load:
    """A steady, paced mix on every shard of a 3-shard map, one thread per shard.

    Each tick (`tick_s`) of shard i starts `jobs` runs of `steps3` on it, `targets` runs of
    `onboarding` on it for each other shard j (workflow_id `ob-<j>-...`: shard j's sender
    signals them), and one `tenant_cancel` sender whose runs are the onboarding targets the
    other shards queued for it since its last tick: every signal crosses shards, through the
    outbox relay, and each target is signalled by exactly one sender. A start that fails (its
    shard unreachable or read-only) is retried with the same workflow_ids, so a start that
    committed before its answer was lost is not doubled; targets are handed to a sender only
    once their start succeeded.

    `client` must reach every shard by a path the faults do not touch (the faultable one
    by its Unix socket), so the load itself never stalls.
    """

    def __init__(self, client: Client, *, tick_s: float = 0.5, jobs: int = 4,
                 targets: int = 2) -> None:
        self.client = client
        self.map = client.map
        self.tick_s = tick_s
        self.jobs = jobs
        self.targets = targets
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._queued: dict[int, list[str]] = defaultdict(list)  # sender shard -> targets
        self._retry: dict[int, list[_Call]] = defaultdict(list)
        self._threads: list[threading.Thread] = []
        self.started: dict[str, set[str]] = defaultdict(set)  # workflow -> workflow_ids

    def start(self) -> Load:
        for index in range(len(self.map.shards)):
            thread = threading.Thread(target=self._loop, args=(index,), daemon=True,
                                      name=f"load-{index}")
            thread.start()
            self._threads.append(thread)
        return self

    def backlog(self, per_shard: int, workflow: str = "steps3") -> None:
        """Start `per_shard` runs of `workflow` on every shard at once: work to drain."""
        for index in range(len(self.map.shards)):
            keys = [key_on(self.map, index, workflow, f"backlog-{index}-{k}")
                    for k in range(per_shard)]
            for first in range(0, per_shard, 500):
                call = _Call(workflow, [(key, None) for key in keys[first:first + 500]])
                if not self._attempt(index, call):
                    raise AssertionError(f"backlog on shard {index}: {self.errors[-1]}")

    def stop(self, flush_timeout: float = 30.0) -> None:
        """Stop ticking, then start what failed and a last sender for every queued target."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.tick_s * 4 + 30)
        deadline = time.monotonic() + flush_timeout
        for index in range(len(self.map.shards)):
            with self._lock:
                calls = self._retry.pop(index, [])
            while calls:
                if self._attempt(index, calls[0]):
                    calls.pop(0)
                elif time.monotonic() > deadline:
                    raise AssertionError(f"load: shard {index}'s starts still fail: "
                                         f"{self.errors[-3:]}")
                else:
                    time.sleep(0.2)
        for index in range(len(self.map.shards)):
            while True:
                sender = self._sender(index, "final")
                if sender is None or self._attempt(index, sender):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"load: last sender on shard {index} fails: "
                                         f"{self.errors[-3:]}")
                time.sleep(0.2)

    def _loop(self, index: int) -> None:
        tick = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                calls = self._retry.pop(index, [])
            for j in range(len(self.map.shards)):
                if j != index:
                    calls.append(_Call("onboarding", [
                        (key_on(self.map, index, "onboarding", f"ob-{j}-{index}-{tick}-{k}"),
                         None) for k in range(self.targets)], targets_for=j))
            calls.append(_Call("steps3", [
                (key_on(self.map, index, "steps3", f"job-{index}-{tick}-{k}"), None)
                for k in range(self.jobs)]))
            sender = self._sender(index, str(tick))
            if sender is not None:
                calls.append(sender)
            failed = [call for call in calls if not self._attempt(index, call)]
            if failed:
                with self._lock:
                    self._retry[index] = failed + self._retry[index]
            tick += 1
            next_at += self.tick_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _sender(self, index: int, tag: str) -> _Call | None:
        with self._lock:
            runs, self._queued[index] = self._queued[index], []
        if not runs:
            return None
        key = key_on(self.map, index, "tenant_cancel", f"tc-{index}-{tag}")
        return _Call("tenant_cancel", [(key, {"runs": runs, "reason": "chaos"})])

    def _attempt(self, index: int, call: _Call) -> bool:
        try:
            started = self.client.start_many(call.workflow, call.items)
        except Exception as exc:  # any refusal: retried with the same keys
            with self._lock:
                self.errors.append(f"shard {index} {call.workflow}: {type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0] if str(exc) else ''}")
            return False
        with self._lock:
            self.started[call.workflow].update(key for key, _ in call.items)
            if call.targets_for is not None:
                self._queued[call.targets_for] += [str(s.execution_id) for s in started]
        return True


# -- observing -------------------------------------------------------------------------


def scalar(url: str, statement: str, *params: Any) -> Any:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(statement, params).fetchone()
    assert row is not None
    return row[0]


def completions(urls: Sequence[str], exclude_prefix: str) -> tuple[int, int]:
    """Runs completed on these shards: (jobs and senders, signalled targets), leaving out
    targets whose workflow_id starts with `exclude_prefix` (those a faulted shard signals)."""
    jobs = signalled = 0
    for url in urls:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE x.workflow_name <> 'onboarding'), "
                "count(*) FILTER (WHERE x.workflow_name = 'onboarding' "
                "AND x.workflow_id NOT LIKE %s) "
                "FROM shardq.events h JOIN shardq.executions x ON x.id = h.execution_id "
                "WHERE h.kind = 'run.completed'", [exclude_prefix + "%"]).fetchone()
        assert row is not None
        jobs += int(row[0])
        signalled += int(row[1])
    return jobs, signalled


def completed_on(url: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM shardq.events WHERE kind = 'run.completed'"))


def unfinished(urls: Sequence[str]) -> int:
    return sum(int(scalar(url, "SELECT count(*) FROM shardq.executions x WHERE NOT EXISTS ("
                               "SELECT FROM shardq.events h WHERE h.execution_id = x.id "
                               "AND h.kind LIKE 'run.%%')"))
               for url in urls)


def outbox_owed(urls: Sequence[str]) -> int:
    return sum(int(scalar(url, "SELECT count(*) FROM shardq.outbox WHERE state <> 'delivered'"))
               for url in urls)


class Watch:
    """Polls `check` on a thread of its own until it holds; `at` is when it first did."""

    def __init__(self, what: str, check: Callable[[], bool], every: float = 0.25) -> None:
        self.what = what
        self.at: float | None = None
        self.last_error = ""
        self._check = check
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"watch-{what}")

    def start(self) -> Watch:
        self.began = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def after(self) -> float | None:
        """Seconds from `start()` to the first time the check held, or None."""
        return None if self.at is None else self.at - self.began

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._check():
                    self.at = time.monotonic()
                    return
            except Exception as exc:  # a probe that fails has not seen it yet
                self.last_error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(self._every)


@dataclass
class Ledger:
    """What every shard holds once the load drained, checked for exactly-once."""

    urls: Sequence[str]
    problems: list[str] = field(default_factory=list)

    def check(self, load: Load) -> list[str]:
        """Every run started exactly once and completed exactly once with the output its
        workflow gives; every step recorded once; every target got exactly one
        `tenant_cancelled`, consumed; nothing left in tasks, waits or the outboxes."""
        runs: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        for url in self.urls:
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                for row in conn.execute("""
                        SELECT x.workflow_name, x.workflow_id, x.id,
                               (SELECT array_agg(h.kind ORDER BY h.seq) FROM shardq.events h
                                WHERE h.execution_id = x.id AND h.kind LIKE 'run.%%'),
                               (SELECT h.payload FROM shardq.events h
                                WHERE h.execution_id = x.id AND h.kind = 'run.completed'),
                               (SELECT array_agg(h.position ORDER BY h.seq) FROM shardq.events h
                                WHERE h.execution_id = x.id AND h.kind = 'step.completed'),
                               (SELECT count(*) FROM shardq.signals s WHERE s.execution_id = x.id),
                               (SELECT count(*) FROM shardq.signals s WHERE s.execution_id = x.id
                                AND s.consumed_at IS NOT NULL)
                        FROM shardq.executions x"""):
                    runs[row[0]].append(row[1:])
                dup = conn.execute("SELECT count(*), (array_agg(kinds))[1:3] FROM ("
                                   "SELECT execution_id, position, kind AS kinds "
                                   "FROM shardq.events WHERE position IS NOT NULL "
                                   "GROUP BY 1, 2, 3 HAVING count(*) > 1) d").fetchone()
                if dup and dup[0]:
                    self.problems.append(f"{url}: {dup[0]} calls recorded twice at one position "
                                         f"(kinds {dup[1]})")
                for table in ("tasks", "waits"):
                    left = conn.execute(f"SELECT count(*) FROM shardq.{table}").fetchone()
                    if left and left[0]:
                        self.problems.append(f"{url}: {left[0]} rows left in shardq.{table}")
                owed = conn.execute("SELECT state, failure_reason, count(*) FROM shardq.outbox "
                                    "WHERE state <> 'delivered' GROUP BY 1, 2").fetchall()
                if owed:
                    self.problems.append(f"{url}: outbox rows not delivered: {owed}")
        for workflow, keys in load.started.items():
            found = [r[0] for r in runs[workflow]]
            if sorted(found) != sorted(keys):
                missing = set(keys) - set(found)
                extra = [k for k in found if k not in keys or found.count(k) > 1]
                self.problems.append(f"{workflow}: {len(keys)} started, {len(found)} stored; "
                                     f"missing {sorted(missing)[:5]}, extra {extra[:5]}")
        self._outcomes({w: r for w, r in runs.items() if w in load.started})
        return self.problems

    def _outcomes(self, runs: dict[str, list[tuple[Any, ...]]]) -> None:
        def bad(what: str, rows: list[tuple[Any, ...]]) -> None:
            if rows:
                self.problems.append(f"{len(rows)} {what}, e.g. {rows[:3]}")

        for workflow, rows in runs.items():
            bad(f"{workflow} runs without exactly one outcome, run.completed",
                [(r[0], r[2]) for r in rows if r[2] != ["run.completed"]])
        runs = defaultdict(list, runs)
        bad("steps3 runs whose steps are not recorded once each (0, 1, 2)",
            [(r[0], r[4]) for r in runs["steps3"] if r[4] != [0, 1, 2]])
        bad("onboarding targets without exactly one consumed tenant_cancelled",
            [(r[0], r[5], r[6]) for r in runs["onboarding"] if (r[5], r[6]) != (1, 1)])
        bad("onboarding targets that did not end cancelled",
            [(r[0], r[3]) for r in runs["onboarding"]
             if r[3] is not None and r[3].get("output") != "stopped: tenant cancelled"])
        sent: list[str] = []
        for r in runs["tenant_cancel"]:
            output = (r[3] or {}).get("output") or {}
            sent += output.get("queued", []) + output.get("signalled", [])
            if output.get("skipped"):
                self.problems.append(f"sender {r[0]} skipped {output['skipped']}")
        targets = [str(r[1]) for r in runs["onboarding"]]
        if sorted(sent) != sorted(targets):
            self.problems.append(f"{len(sent)} signals sent for {len(targets)} targets "
                                 f"({len(set(sent))} distinct)")


def stderr_since(path: Path, offset: int) -> str:
    with path.open("rb") as err:
        err.seek(offset)
        return err.read().decode(errors="replace")

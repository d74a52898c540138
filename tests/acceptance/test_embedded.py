"""The embedded PostgreSQL starter, against real initdb and postgres processes."""

from __future__ import annotations

import os
import pwd
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shardq.shards.embedded import EmbeddedPostgres, EmbeddedPostgresError, find_pg_bindir

psycopg = pytest.importorskip("psycopg")


def _alive(pid: int) -> bool:
    # A zombie counts as dead: an orphaned postmaster is reaped by whatever runs as pid 1,
    # which in a container may never reap it.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        # ProcessLookupError: the process exited between the open and the read.
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue  # exited meanwhile
        if ppid == pid:
            found.append(int(entry.name))
    return found


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def test_start_create_connect_stop() -> None:
    with EmbeddedPostgres() as pg:
        assert pg.running
        pid, workdir = pg.pid, pg.workdir
        assert pid is not None and workdir is not None and workdir.is_dir()
        dsn = pg.create_database("shardq_test")
        assert dsn == pg.dsn("shardq_test")
        with psycopg.connect(dsn) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            assert conn.execute("show listen_addresses").fetchone() == ("",)
            assert conn.execute("select current_database()").fetchone() == ("shardq_test",)
            assert int(conn.execute("show max_connections").fetchone()[0]) >= 200
        if os.geteuid() == 0:
            uid = Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0]
            assert int(uid) == pwd.getpwnam("nobody").pw_uid
        with pytest.raises(EmbeddedPostgresError, match="already exists"):
            pg.create_database("shardq_test")
    assert not pg.running
    assert not workdir.exists()
    assert not _alive(pid)
    pg.stop()  # idempotent


def test_server_dies_with_its_parent() -> None:
    script = textwrap.dedent(
        """
        import time
        from shardq.shards.embedded import EmbeddedPostgres
        pg = EmbeddedPostgres().start()
        print(pg.pid, pg.workdir, flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    workdir = None
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready, "the child did not report its server within 60 s"
        pid_text, workdir = child.stdout.readline().split()
        postmaster = int(pid_text)
        server = [postmaster, *_children(postmaster)]
        assert _alive(postmaster) and len(server) > 1
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert _wait_gone(server, timeout=10) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if workdir is not None:
            # Nothing of the killed parent survives to delete it.
            shutil.rmtree(workdir, ignore_errors=True)


def test_find_pg_bindir_honours_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("initdb", "postgres"):
        (tmp_path / name).touch(mode=0o755)
    monkeypatch.setenv("SHARDQ_PG_BINDIR", str(tmp_path))
    assert find_pg_bindir() == tmp_path


def test_find_pg_bindir_rejects_bad_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDQ_PG_BINDIR", "/nonexistent/pg/bin")
    with pytest.raises(EmbeddedPostgresError, match="SHARDQ_PG_BINDIR"):
        find_pg_bindir()
    with pytest.raises(EmbeddedPostgresError, match="SHARDQ_PG_BINDIR"):
        EmbeddedPostgres().start()


def test_dsn_needs_a_started_server() -> None:
    with pytest.raises(EmbeddedPostgresError, match="not started"):
        EmbeddedPostgres().dsn()

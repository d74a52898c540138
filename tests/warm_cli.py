"""A warm `shardq` for the tests: each call a process of its own, forked from one that
has imported the command already.

The suite runs the command line a few hundred times (tests/support.py's `run_cli`),
and a fresh interpreter spends about 0.3 s of CPU importing Python, click and psycopg
before the command does anything: a minute of the suite's two cores. Here one server
process per test process imports `shardq.bin.cli` once and, for each call, forks a
child that forks the command itself. The command runs in a process of its own, as a
user's does: its environment, working directory, `PYTHONPATH`, standard input and
output are the call's, an exception or `sys.exit` ends it through the interpreter's
own exit (threads joined, atexit handlers run), and the exit code is the process's.
What it shares with the server is only the modules already imported: a test about
what the command imports at start runs a fresh interpreter instead
(tests/unit/test_bin_layout.py), and `SHARDQ_TEST_FRESH_CLI=1` makes every call one.

The middle process waits for the command and reports its exit code over the
call's socket; the server itself never waits (its children are reaped by the
kernel) and exits when its parent's pipe closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_servers: list[tuple[subprocess.Popen[bytes], str]] = []
"""This test process's server and its socket's path, once started."""


def run(args: list[str], env: dict[str, str], cwd: Path, stdin: str | None,
        timeout: float) -> subprocess.CompletedProcess[str]:
    """`python -m shardq.bin.cli ARGS`, its output and exit code, as subprocess.run gives
    them; TimeoutExpired (the command killed) past `timeout` seconds."""
    path = _started(env)
    with tempfile.TemporaryDirectory(prefix="shardq-cli-") as folder:
        out, err, given = (os.path.join(folder, n) for n in ("out", "err", "in"))
        Path(given).write_text(stdin if stdin is not None else "")
        request = {"args": args, "env": env, "cwd": str(cwd), "out": out, "err": err,
                   "stdin": given if stdin is not None else os.devnull}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(path)
            conn.sendall(json.dumps(request).encode() + b"\n")
            reader = conn.makefile("r")
            pid: int | None = None
            try:
                pid = int(reader.readline())
                line = reader.readline()
            except TimeoutError:
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(["shardq", *args], timeout) from None
            if not line:
                raise RuntimeError(f"the warm shardq lost the call {args!r}")
            code = int(line)
        return subprocess.CompletedProcess(
            [sys.executable, "-m", "shardq.bin.cli", *args], code,
            Path(out).read_text(errors="replace"), Path(err).read_text(errors="replace"))


def _started(env: dict[str, str]) -> str:
    with _lock:
        if not _servers or _servers[-1][0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="shardq-warm-"), "cli.sock")
            proc = subprocess.Popen(
                [sys.executable, "-m", "shardq.tests.warm_cli", path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError("the warm shardq did not start")
            _servers.append((proc, path))
        return _servers[-1][1]


def serve(path: str) -> None:
    """The server's loop: a child per connection until standard input closes."""
    import shardq.bin.cli.main  # noqa: F401 - what every call would import first

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the middle processes
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready:  # the test process is gone
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
            os._exit(0)
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            _call(conn)  # never returns
        conn.close()


def _call(conn: socket.socket) -> None:
    """The middle process: fork the command, report its pid, then its exit code."""
    request = json.loads(conn.makefile("r").readline())
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _command(request)  # leaves through the interpreter's exit
    conn.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def _command(request: dict[str, Any]) -> None:
    """The command's process, set up as `python -m shardq.bin.cli` would be."""
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.chdir(request["cwd"])
    written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for fd, name, mode in ((0, "stdin", os.O_RDONLY), (1, "out", written), (2, "err", written)):
        opened = os.open(request[name], mode, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    from shardq.bin.cli import main as entry

    sys.argv = [os.path.join(os.path.dirname(entry.__file__), "__main__.py"), *request["args"]]
    entry.main(request["args"])
    sys.exit(0)


if __name__ == "__main__":
    serve(sys.argv[1])

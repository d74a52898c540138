"""The `http` scenario: keyed signals per second through `shardq serve` beside Client.signal.

The same runs, the same number of sending threads, the same keyed signals:
once through the Python client in this process, once as HTTP requests (one
keep-alive connection per thread) to a `shardq serve` process, and once to a
`shardq serve --workers 2` (two processes sharing the port). No worker runs,
so the runs stay pending and every signal is buffered: what is measured is the
send path (HTTP parsing, auth, the one rule set, the deliver_signals commit),
not the wake. The HTTP sender is a bare socket per thread (_Connection): what
is measured is the ingress, not an HTTP client library sharing its cores.
Rounds alternate the paths so drift on a noisy box hits each. Beside the
rates: each path's p99, and the server's CPU per request (its processes' CPU
time over the round, divided by the requests).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.db import BenchError
from shardq.benchmarks.measure import Progress, percentiles

RUNS = 200
"""Targets the signals are spread over (each buffers at most 1,000 of one name)."""
ROUNDS = 2
Send = Callable[[int, int], None]
"""send(signal index, thread index): one keyed signal, raising on any refusal."""


def http_signals(b: Bench) -> dict[str, Any]:
    b.stop_fleet()
    b.reset()
    n, threads = b.sizes.http_signals // ROUNDS, b.sizes.signal_threads
    runs = [r.execution_id for r in b.client.start_many(
        "park", [(f"http-{i}", None) for i in range(RUNS)])]
    rounds: dict[str, list[dict[str, Any]]] = {"client": [], "http": [], "http_2": []}
    with _server(b, 1) as one, _server(b, 2) as two:
        servers = {"http": one, "http_2": two}
        sessions = {path: [_Connection(server.base, server.token) for _ in range(threads)]
                    for path, server in servers.items()}
        try:
            for r in range(ROUNDS):
                rounds["client"].append(_measure(
                    f"client round {r + 1}", n, threads, _client_sender(b, runs, r)))
                for path, clients in sessions.items():
                    rounds[path].append(_measure(
                        f"{path} round {r + 1}", n, threads,
                        _http_sender(clients, runs, f"{path}-{r}"), servers[path].cpu_s))
        finally:
            for clients in sessions.values():
                for session in clients:
                    session.close()
    best = {path: max(found, key=lambda m: m["signals_per_s"])
            for path, found in rounds.items()}
    rate = {path: m["signals_per_s"] for path, m in best.items()}
    p99 = {path: m["latency_ms"]["p99"] for path, m in best.items()}
    return {
        "signals_per_round": n, "threads": threads, "runs": RUNS, "rounds": rounds,
        "client_signals_per_s": rate["client"], "http_signals_per_s": rate["http"],
        "http_2_processes_signals_per_s": rate["http_2"],
        "http_over_client": round(rate["http"] / rate["client"], 3),
        "http_2_processes_over_client": round(rate["http_2"] / rate["client"], 3),
        "client_p99_ms": p99["client"], "http_p99_ms": p99["http"],
        "http_p99_over_client": round(p99["http"] / p99["client"], 3),
        # The least of the rounds: the server's own cost, with the least noise on top.
        "http_server_cpu_ms_per_request": min(
            m["server_cpu_ms_per_request"] for m in rounds["http"]),
        "http_2_server_cpu_ms_per_request": min(
            m["server_cpu_ms_per_request"] for m in rounds["http_2"]),
    }


def _client_sender(b: Bench, runs: list[uuid.UUID], round_: int) -> Send:
    def send(i: int, _thread: int) -> None:
        result = b.client.signal(runs[i % RUNS], "go", {"n": i},
                                 idempotency_key=f"client-{round_}-{i}")
        if not result.delivered:
            raise BenchError(f"client signal {i} was a duplicate")

    return send


def _http_sender(sessions: list[_Connection], runs: list[uuid.UUID], round_: str) -> Send:
    def send(i: int, thread: int) -> None:
        status, body = sessions[thread].post(
            f"/workflows/{runs[i % RUNS]}/signal/go", b'{"n": %d}' % i,
            idempotency_key=f"http-{round_}-{i}")
        if status != 202 or not json.loads(body)["signal_delivered"]:
            raise BenchError(f"http signal {i}: {status} {body[:200]!r}")

    return send


class _Connection:
    """One keep-alive HTTP/1.1 connection that sends a POST and reads its answer, and does
    nothing else. The sender shares two cores with the server and PostgreSQL: httpx
    spends about 0.8 ms of this process's CPU on a request (more than the server spends
    answering it), which would measure httpx, not the ingress. A webhook's sender runs
    elsewhere."""

    IDLE_S = 2.0
    """Idle longer than this, the connection is made again before a request: uvicorn
    closes a keep-alive connection idle for 5 s (while the other paths' rounds run)."""

    def __init__(self, base: str, token: str) -> None:
        url = urlsplit(base)
        self._address = (url.hostname or "127.0.0.1", url.port or 80)
        self._prefix = url.path
        self._head = (f"Host: {url.netloc}\r\nAuthorization: Bearer {token}\r\n"
                      "Content-Type: application/json\r\n").encode()
        self._socket: socket.socket | None = None
        self._used = 0.0
        self._buffer = b""

    def _connected(self) -> socket.socket:
        if self._socket is None or time.monotonic() - self._used > self.IDLE_S:
            self.close()
            self._socket = socket.create_connection(self._address, timeout=30)
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._buffer = b""
        self._used = time.monotonic()
        return self._socket

    def post(self, path: str, body: bytes, *, idempotency_key: str) -> tuple[int, bytes]:
        self._connected().sendall(
            b"POST %s HTTP/1.1\r\n%sIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s"
            % ((self._prefix + path).encode(), self._head, idempotency_key.encode(),
               len(body), body))
        head = self._read_until(b"\r\n\r\n")
        status = int(head[9:12])
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        return status, self._read(length)

    def _read_until(self, end: bytes) -> bytes:
        while (at := self._buffer.find(end)) < 0:
            self._fill()
        found, self._buffer = self._buffer[:at], self._buffer[at + len(end):]
        return found

    def _read(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill()
        found, self._buffer = self._buffer[:size], self._buffer[size:]
        return found

    def _fill(self) -> None:
        assert self._socket is not None
        chunk = self._socket.recv(65536)
        if not chunk:
            raise BenchError("shardq serve closed the connection")
        self._buffer += chunk

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _measure(
    label: str, n: int, threads: int, send: Send, server_cpu: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """`n` signals from `threads` threads: the rate, the latencies, and with `server_cpu`
    (the server's CPU seconds so far) what each request cost the server."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    failures: list[BaseException] = []

    def sender(t: int) -> None:
        try:
            for i in range(t, n, threads):
                started = time.perf_counter()
                send(i, t)
                latencies[t].append((time.perf_counter() - started) * 1000)
        except BaseException as exc:  # reported below
            failures.append(exc)

    workers = [threading.Thread(target=sender, args=(t,)) for t in range(threads)]
    bar = Progress(f"http: {label}", n)
    cpu_before = server_cpu() if server_cpu else 0.0
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):
        bar.update(sum(len(x) for x in latencies))
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    cpu = server_cpu() - cpu_before if server_cpu else None
    bar.close()
    if failures:
        raise BenchError(f"{label}: {failures[0]!r}")
    stats = percentiles([v for x in latencies for v in x])
    return {"signals": n, "seconds": round(seconds, 3),
            "signals_per_s": round(n / seconds, 1),
            "latency_ms": {k: round(v, 2) for k, v in stats.items()},
            **({} if cpu is None else {"server_cpu_ms_per_request": round(cpu * 1000 / n, 3)})}


@dataclass(frozen=True)
class _Server:
    base: str
    """The API's base URL."""
    token: str
    process: psutil.Process

    def cpu_s(self) -> float:
        """CPU seconds the server has used so far, its worker processes' included."""
        total = 0.0
        for proc in (self.process, *self.process.children(recursive=True)):
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total


@contextmanager
def _server(b: Bench, processes: int) -> Iterator[_Server]:
    """`shardq serve` over the bench's shards (`processes` of them sharing the port)."""
    cli = [sys.executable, "-m", "shardq.bin.cli"]
    # The bench's runs belong to the default tenant, and so does the token.
    made = json.loads(subprocess.run([*cli, "api-token", "default", "--json"], check=True,
                                     capture_output=True, text=True).stdout)
    with tempfile.TemporaryDirectory(prefix="shardq-bench-http-") as folder:
        tokens = Path(folder) / "tokens"
        tokens.write_text(made["tokens_file_line"] + "\n")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        log = (Path(folder) / "serve.log").open("w")
        process = subprocess.Popen(
            [*cli, "--shards", ",".join(b.urls), "serve",
             "--app", "shardq.benchmarks.workflows:registry", "--port", str(port),
             "--tokens-file", str(tokens), "--workers", str(processes)],
            stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}/api/shardq"
        try:
            _wait_ready(base, process)
            yield _Server(base, made["token"], psutil.Process(process.pid))
        finally:
            process.terminate()
            process.wait(timeout=30)
            log.close()


def _wait_ready(base: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"shardq serve exited with {process.returncode}")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise BenchError("shardq serve did not answer within 30 s")

"""The `http` scenario: keyed signals per second through `shardq serve` beside Client.signal.

The same runs, the same number of sending threads, the same keyed signals:
once through the Python client in this process, once as HTTP requests (one
keep-alive httpx connection per thread) to a `shardq serve` process, and once
to a `shardq serve --workers 2` (two processes sharing the port). No
worker runs, so the runs stay pending and every signal is buffered: what is
measured is the send path (HTTP parsing, auth, the one rule set, one
deliver_signals commit per call), not the wake. Rounds alternate the two
paths so drift on a noisy box hits both.
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
from pathlib import Path
from typing import Any

import httpx

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
        sessions = {path: [httpx.Client(base_url=base, timeout=30,
                                        headers={"Authorization": f"Bearer {token}"})
                           for _ in range(threads)]
                    for path, (base, token) in (("http", one), ("http_2", two))}
        try:
            for r in range(ROUNDS):
                rounds["client"].append(_measure(
                    f"client round {r + 1}", n, threads, _client_sender(b, runs, r)))
                for path, clients in sessions.items():
                    rounds[path].append(_measure(
                        f"{path} round {r + 1}", n, threads,
                        _http_sender(clients, runs, f"{path}-{r}")))
        finally:
            for clients in sessions.values():
                for session in clients:
                    session.close()
    best = {path: max(m["signals_per_s"] for m in found) for path, found in rounds.items()}
    return {
        "signals_per_round": n, "threads": threads, "runs": RUNS, "rounds": rounds,
        "client_signals_per_s": best["client"], "http_signals_per_s": best["http"],
        "http_2_processes_signals_per_s": best["http_2"],
        "http_over_client": round(best["http"] / best["client"], 3),
        "http_2_processes_over_client": round(best["http_2"] / best["client"], 3),
    }


def _client_sender(b: Bench, runs: list[uuid.UUID], round_: int) -> Send:
    def send(i: int, _thread: int) -> None:
        result = b.client.signal(runs[i % RUNS], "go", {"n": i},
                                 idempotency_key=f"client-{round_}-{i}")
        if not result.delivered:
            raise BenchError(f"client signal {i} was a duplicate")

    return send


def _http_sender(sessions: list[httpx.Client], runs: list[uuid.UUID], round_: str) -> Send:
    def send(i: int, thread: int) -> None:
        answer = sessions[thread].post(
            f"/workflows/{runs[i % RUNS]}/signal/go", content=b'{"n": %d}' % i,
            headers={"Idempotency-Key": f"http-{round_}-{i}"})
        if answer.status_code != 202 or not answer.json()["signal_delivered"]:
            raise BenchError(f"http signal {i}: {answer.status_code} {answer.text[:200]}")

    return send


def _measure(label: str, n: int, threads: int, send: Send) -> dict[str, Any]:
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
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):
        bar.update(sum(len(x) for x in latencies))
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    bar.close()
    if failures:
        raise BenchError(f"{label}: {failures[0]!r}")
    stats = percentiles([v for x in latencies for v in x])
    return {"signals": n, "seconds": round(seconds, 3),
            "signals_per_s": round(n / seconds, 1),
            "latency_ms": {k: round(v, 2) for k, v in stats.items()}}


@contextmanager
def _server(b: Bench, processes: int) -> Iterator[tuple[str, str]]:
    """`shardq serve` over the bench's shards (`processes` of them sharing the port): its
    API's base URL and a token."""
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
            yield base, made["token"]
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

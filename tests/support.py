"""Helpers tests import (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from shardq.shards.config import ShardMap

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `shardq` as a user would, in a separate process (`stdin` is its input)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    full_env.update(env or {})
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


def all_rows(shard_map: ShardMap, query: str, *params: object) -> list[tuple[Any, ...]]:
    """The same query on every shard, results concatenated."""
    return [r for shard in shard_map.shards for r in rows(shard.url, query, *params)]

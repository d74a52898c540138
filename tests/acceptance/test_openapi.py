"""The OpenAPI document is valid, and says what a real `shardq serve` does under fuzzing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from openapi_spec_validator import validate

from shardq.bin.api import hash_token
from shardq.shards.config import ShardMap

from ..support import Daemon, free_port, wait_until

pytestmark = pytest.mark.slow
TOKEN = "sq_fuzz-token"


def test_the_served_document_validates_and_fuzzing_finds_nothing(
    shard_map: ShardMap, daemons: Callable[..., Daemon], tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"acme {hash_token(TOKEN)}\n")
    port = free_port()
    daemons(["--shards", ",".join(s.url for s in shard_map.shards), "serve", "--app",
             "shardq.bin.examples:registry", "--port", str(port), "--tokens-file",
             str(tokens)]).wait_for("shardq API on")
    url = f"http://127.0.0.1:{port}/api/shardq/openapi.json"
    document = wait_until(lambda: _fetch(url), what="the API")
    validate(document)
    # Every check schemathesis has: no 5xx, only documented statuses, content types and
    # bodies that match the document, schema-valid requests accepted and invalid ones
    # refused, 405s that name the allowed methods; then links from a start into the
    # routes about one run (the stateful phase). A fixed seed keeps CI repeatable.
    schemathesis = Path(sys.executable).parent / "schemathesis"
    done = subprocess.run(
        [str(schemathesis), "run", url, "-H", f"Authorization: Bearer {TOKEN}",
         "--max-examples", "15", "--seed", "20261203", "--workers", "2",
         "--request-timeout", "30", "--report-dir", str(tmp_path / "report")],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "generated" in done.stdout and " passed" in done.stdout, done.stdout[-2000:]


def _fetch(url: str) -> dict[str, object] | None:
    try:
        answer = httpx.get(url, timeout=5)
    except httpx.TransportError:
        return None
    return answer.json() if answer.status_code == 200 else None

"""Helpers tests import (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `shardq` as a user would, in a separate process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "shardq.bin.cli", *args],
        check=False, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=ROOT,
    )

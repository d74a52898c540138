#!/usr/bin/env bash
# The whole check: lint, types, tests. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/dev-env.sh"
cd "$SHARDQ_ROOT"
echo "== ruff" && ruff check .
echo "== mypy" && mypy -p shardq.shards -p shardq.queue -p shardq.outbox -p shardq.bin \
  -p shardq.tests -p shardq.benchmarks
echo "== pytest" && python -m pytest "$@"

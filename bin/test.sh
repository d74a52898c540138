#!/usr/bin/env bash
# The whole check: lint, types, tests. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/dev-env.sh"
cd "$SHARDQ_ROOT"
echo "== ruff" && ruff check .
packages=()
for folder in core workflow client worker store shards outbox moves bin tests benchmarks examples; do
  if compgen -G "$folder/*.py" >/dev/null; then packages+=(-p "shardq.$folder"); fi
done
echo "== mypy" && mypy "${packages[@]}"
echo "== mkdocs" && NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet
# The whole suite runs on two xdist workers, one test file each at a time (a
# file's fixtures and daemons stay together): 2.5 minutes instead of 4.3 on CI's
# two cores, most tests waiting on PostgreSQL or a subprocess. Every worker
# makes its own shard databases (tests/conftest.py). A run given arguments
# (a folder, -k, -m) is serial unless SHARDQ_TEST_WORKERS says otherwise.
workers="${SHARDQ_TEST_WORKERS:-$([ $# -eq 0 ] && echo 2 || echo 0)}"
parallel=()
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadfile); fi
echo "== pytest" && python -m pytest "${parallel[@]}" "$@"

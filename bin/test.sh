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
# The whole suite runs on three xdist workers, one test file each at a time (a
# file's fixtures and daemons stay together). On two cores a third worker still
# pays: many tests wait (a fault held for 30 s, a subprocess, PostgreSQL), and it
# runs others meanwhile: 8 min 16 s instead of 10 min 21 s, the machine 92 % busy
# (2026-12-08). Every worker makes its own shard databases (tests/conftest.py). A
# run given arguments (a folder, -k, -m) is serial unless SHARDQ_TEST_WORKERS says
# otherwise.
workers="${SHARDQ_TEST_WORKERS:-$([ $# -eq 0 ] && echo 3 || echo 0)}"
parallel=()
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadfile); fi
echo "== pytest" && python -m pytest "${parallel[@]}" "$@"

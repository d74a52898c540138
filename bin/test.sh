#!/usr/bin/env bash
# The whole check: lint, types, tests. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/dev-env.sh"
cd "$SHARDQ_ROOT"
echo "== ruff" && ruff check .
packages=()
for folder in shards queue outbox bin tests benchmarks; do
  if compgen -G "$folder/*.py" >/dev/null; then packages+=(-p "shardq.$folder"); fi
done
echo "== mypy" && mypy "${packages[@]}"
echo "== pytest" && python -m pytest "$@"

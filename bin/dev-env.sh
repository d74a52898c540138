#!/usr/bin/env bash
# Sourced by demo.sh and test.sh: the project's virtual environment, created and
# (re)installed from pyproject.toml when missing or older than it. Also sourced
# by hand (benchmarks/README.md): it sets no shell options, and fails by `return`
# when sourced, so a developer's shell keeps its own options and survives it.
SHARDQ_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SHARDQ_VENV:-$SHARDQ_ROOT/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "shardq needs Python 3.11 or newer as '$python' (set PYTHON=...)" >&2
    return 1 2>/dev/null || exit 1
  fi
  if ! "$python" -m venv "$venv"; then
    echo "creating a virtual environment failed; on Debian/Ubuntu: apt-get install python3-venv" >&2
    return 1 2>/dev/null || exit 1
  fi
fi
stamp="$venv/.shardq-installed"
if [ ! -f "$stamp" ] || [ "$SHARDQ_ROOT/pyproject.toml" -nt "$stamp" ]; then
  echo "installing shardq and its dependencies into $venv ..." >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip &&
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$SHARDQ_ROOT[dev]" &&
    touch "$stamp" || { return 1 2>/dev/null || exit 1; }
fi
export PATH="$venv/bin:$PATH"

#!/usr/bin/env bash
# The demo: a checkout workflow end to end on two shards. Uses SHARDQ_SHARDS when
# set, else a throw-away embedded PostgreSQL that is deleted afterwards.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/dev-env.sh"
exec python -m shardq.bin.demo "$@"

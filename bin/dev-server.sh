#!/usr/bin/env bash
# A local PostgreSQL with two migrated shard databases for trying shardq, kept until
# Ctrl-C (or `bash bin/dev-server.sh stop` from another terminal) and then deleted.
# Prints the `export SHARDQ_SHARDS=...` line; `bash bin/dev-server.sh env` prints it again.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/dev-env.sh"
exec shardq dev "$@"

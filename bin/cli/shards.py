"""`shardq shards`: the shard map, each shard's reachability and schema version.

This is the place for the shard map's commands: a `shards` group (moving bucket
ranges between shards, with this listing as one of its commands) goes here.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from shardq.bin.cli.common import Settings, emit, errors_as_exit_codes, json_option, pass_settings


@click.command("shards")
@json_option
@pass_settings
def shards_command(settings: Settings) -> None:
    """Show the shard map, each shard's reachability and schema version."""
    from shardq.shards.config import redact
    from shardq.shards.migrations import check_shard, load_schema

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        schema = load_schema()
        required = schema.version
        statuses = [check_shard(shard_map, s, schema=schema) for s in shard_map.shards]
    rows: list[dict[str, Any]] = [
        {
            "name": st.shard.name,
            "url": redact(st.shard.url),
            "buckets": [st.shard.first_bucket, st.shard.last_bucket],
            "reachable": st.reachable,
            "server_version": st.server_version,
            "schema_version": st.schema_version,
            "ok": st.problem is None,
            "problem": st.problem,
        }
        for st in statuses
    ]
    lines = [f"shard map {shard_map.fingerprint}, schema version needed {required}"]
    for r in rows:
        state = "ok" if r["ok"] else r["problem"]
        lines.append(
            f"  {r['name']:<10} buckets {r['buckets'][0]:>4}-{r['buckets'][1]:<4} "
            f"{r['url']}  schema {r['schema_version']}  {state}"
        )
    emit(
        settings,
        {"fingerprint": shard_map.fingerprint, "required_schema": required, "shards": rows},
        "\n".join(lines),
    )
    codes = [
        3 if not st.reachable else 4 if "map mismatch" in st.problem else 5
        for st in statuses if st.problem
    ]
    if codes:
        sys.exit(min(codes))  # unreachable outranks a mismatch, which outranks an old schema


COMMANDS = [shards_command]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""

"""The `shardq` command: parse, call one library function, format.

The root group and its options are here; each group of commands has a module:

- workflow.py: `workflow ...`, start, signal, inspect, decide and cancel runs;
- builds.py: `workflow builds|set-build|clear-build|migrate-build`, build pinning;
- limits.py: `limits ...`, concurrency limits per key;
- fairness.py: `fairness ...`, tenants' weights in fair claims;
- rates.py: `rates ...`, rate limiters;
- schedules.py: `schedule ...`, schedules;
- replay.py: `replay` (histories against the code) and `history export`;
- outbox.py: `outbox ...` (what the outboxes owe) and the `outbox-relay` daemon;
- shards.py: `shards`, the shard map and each shard's state;
- operations.py: `migrate`, `stale`, `purge` and the `metrics` exporter;
- worker.py: the `worker` daemon;
- serve.py: `serve` (the HTTP API and the inbox, bin/web/) and `api-token`;
- dev.py: `dev`, a throw-away local PostgreSQL;
- common.py: settings, options, exit codes and errors they all share.

`python -m shardq.bin.cli` runs it too (__main__.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from shardq.bin.cli import (
    builds,
    bulk,
    counting,
    dev,
    fairness,
    limits,
    operations,
    outbox,
    rates,
    replay,
    schedules,
    serve,
    worker,
    workflow,
)
from shardq.bin.cli import shards as shard_map
from shardq.bin.cli.common import EXIT_USAGE, Settings, fail
from shardq.bin.logs import configure as configure_logging
from shardq.shards.config import ENV_SHARDS


@click.group()
@click.version_option(package_name="shardq", prog_name="shardq")
@click.option(
    "--shards", metavar="URLS", help=f"Comma-separated PostgreSQL URLs [env {ENV_SHARDS}]"
)
@click.option(
    "--shards-file",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="SHARDQ_SHARDS_FILE",
    help="TOML shard map (overrides --shards) [env SHARDQ_SHARDS_FILE]",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
@click.option("--log-format", type=click.Choice(["logfmt", "json"]), default="logfmt",
              envvar="SHARDQ_LOG_FORMAT", show_default=True,
              help="Log lines as key=value or as JSON objects [env SHARDQ_LOG_FORMAT].")
@click.pass_context
def cli(
    ctx: click.Context, shards: str | None, shards_file: Path | None, as_json: bool, verbose: int,
    log_format: str,
) -> None:
    """shardq: durable workflows on sharded PostgreSQL."""
    configure_logging(verbose, log_format)
    ctx.obj = Settings(shards, shards_file, as_json, verbose)
    ctx.obj.log_format = log_format


for command in (*workflow.COMMANDS, *limits.COMMANDS, *fairness.COMMANDS, *rates.COMMANDS,
                *schedules.COMMANDS, *outbox.COMMANDS, *replay.COMMANDS,
                *shard_map.COMMANDS, *operations.COMMANDS, *worker.COMMANDS, *serve.COMMANDS,
                *dev.COMMANDS):
    cli.add_command(command)
for command in (*builds.WORKFLOW_COMMANDS, *counting.WORKFLOW_COMMANDS,
                *bulk.WORKFLOW_COMMANDS):
    workflow.workflow.add_command(command)


def main(args: list[str] | None = None) -> None:
    """Run the command; click's own usage errors become one line (JSON with --json) too."""
    try:
        code = cli.main(args, prog_name="shardq", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `shardq`: the help, as usual
        exc.show()
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        fail(exc.format_message() + hint, EXIT_USAGE)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)

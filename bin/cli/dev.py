"""`shardq dev`: a throw-away local PostgreSQL with migrated shards, for trying shardq.

Its server binaries come from the optional extra `shardq[embedded]` or a local
PostgreSQL, so shards/embedded.py is imported inside the command, never at the top.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from shardq.bin.cli.common import EXIT_USAGE, errors_as_exit_codes, fail, stop_on_signals
from shardq.shards.config import ENV_SHARDS, ShardMap


def _dev_state(ctx: click.Context) -> Path:
    import os
    import tempfile

    explicit: Path | None = ctx.meta.get("shardq.dev_state")
    return explicit or Path(tempfile.gettempdir()) / f"shardq-dev-{os.getuid()}.json"


def _running_dev(path: Path) -> dict[str, Any] | None:
    """The running dev server's record, or None (a record left by a killed one is dropped)."""
    import os

    try:
        record: dict[str, Any] = json.loads(path.read_text())
        os.kill(int(record["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return None
    return record


@click.group(invoke_without_command=True)
@click.option("--shard-count", default=2, show_default=True, help="Shard databases to create.")
@click.option("--state-file", type=click.Path(path_type=Path, dir_okay=False),
              envvar="SHARDQ_DEV_STATE",
              help="Where `dev stop` and `dev env` find the server [default: a file in /tmp]")
@click.pass_context
def dev(ctx: click.Context, shard_count: int, state_file: Path | None) -> None:
    """A local PostgreSQL with migrated shards, until Ctrl-C or `shardq dev stop`.

    Prints the `export SHARDQ_SHARDS=...` line for other terminals. The server
    and its data are deleted when it stops.
    """
    import os

    from shardq.shards.embedded import EmbeddedPostgres, EmbeddedPostgresError
    from shardq.shards.migrations import migrate as run_migrations

    ctx.meta["shardq.dev_state"] = state_file
    if ctx.invoked_subcommand is not None:
        return
    path = _dev_state(ctx)
    if (running := _running_dev(path)) is not None:
        fail(f"a dev server is already running (pid {running['pid']}): `shardq dev env` "
             "prints its SHARDQ_SHARDS, `shardq dev stop` stops it", EXIT_USAGE)
    if not 1 <= shard_count <= 16:
        fail("--shard-count must be within 1..16", EXIT_USAGE)
    try:
        server = EmbeddedPostgres().start()
    except EmbeddedPostgresError as exc:
        fail(f"cannot start the dev server: {exc}", 3)
    try:
        try:
            urls = [server.create_database(f"shardq_dev_{i}") for i in range(shard_count)]
        except EmbeddedPostgresError as exc:
            fail(f"cannot create the shard databases: {exc}", 3)
        shards = ",".join(urls)
        with errors_as_exit_codes():
            version = run_migrations(ShardMap.from_urls(urls))[0].version
        stop = stop_on_signals()
        path.write_text(json.dumps({"pid": os.getpid(), "shards": shards}))
        click.echo(
            f"shardq dev: {shard_count} shard databases on a local PostgreSQL, migrated to "
            f"schema version {version}\n(data in {server.workdir}, deleted when this stops)."
            f" In another terminal:\n\n{_export_line(shards)}\n\n"
            "Stop with Ctrl-C here or `shardq dev stop`."
        )
        stop.wait()
    finally:
        server.stop()
        path.unlink(missing_ok=True)  # last: `dev stop` waits for it to go
    click.echo("shardq dev: stopped; the server and its data are deleted", err=True)


def _export_line(shards: str) -> str:
    return f"export {ENV_SHARDS}='{shards}'"


@dev.command("env")
@click.pass_context
def dev_env(ctx: click.Context) -> None:
    """Print the running dev server's `export SHARDQ_SHARDS=...` line."""
    running = _running_dev(_dev_state(ctx))
    if running is None:
        fail("no dev server is running: start one with `shardq dev` "
             "(or bash bin/dev-server.sh)", 3)
    click.echo(_export_line(running["shards"]))


@dev.command("stop")
@click.pass_context
def dev_stop(ctx: click.Context) -> None:
    """Stop the running dev server (its data is deleted)."""
    import os
    import signal
    import time

    path = _dev_state(ctx)
    running = _running_dev(path)
    if running is None:
        click.echo("shardq dev: no dev server is running", err=True)
        return
    os.kill(int(running["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _running_dev(path) is not None:
        if time.monotonic() > deadline:
            fail(f"the dev server (pid {running['pid']}) did not stop within 30 s", 1)
        time.sleep(0.05)
    click.echo("shardq dev: stopped", err=True)


COMMANDS = [dev]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""

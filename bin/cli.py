"""The `shardq` command: parse, call one library function, format.

Exit codes (also in the README):
  0 success · 1 unexpected error · 2 bad usage or configuration · 3 a shard is
  unavailable · 4 shard map mismatch · 5 schema behind · 6 a migration failed ·
  7 a workflow-level refusal (unknown workflow, bad input, not found)
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from shardq.shards.config import ENV_SHARDS, ShardMap, load_shard_map
from shardq.shards.errors import (
    ConfigError,
    MapMismatch,
    MigrationError,
    SchemaBehind,
    ShardqError,
    ShardUnavailable,
)

EXIT_CODES: dict[type[ShardqError], int] = {
    ConfigError: 2,
    ShardUnavailable: 3,
    MapMismatch: 4,
    SchemaBehind: 5,
    MigrationError: 6,
}
EXIT_WORKFLOW = 7
F = TypeVar("F", bound=Callable[..., Any])


class Settings:
    """What the group's options resolved to; commands pull the shard map lazily."""

    def __init__(self, shards: str | None, shards_file: Path | None, as_json: bool) -> None:
        self._shards = shards
        self._shards_file = shards_file
        self.as_json = as_json

    def shard_map(self) -> ShardMap:
        if self._shards_file is not None:
            return load_shard_map(self._shards_file)
        if self._shards:
            return ShardMap.from_env({**_pool_env(), ENV_SHARDS: self._shards})
        return ShardMap.from_env()


def _pool_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k.startswith("SHARDQ_POOL_")}


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"shardq: error: {message}", err=True)
    sys.exit(code)


@contextmanager
def errors_as_exit_codes() -> Iterator[None]:
    """One line on stderr and a meaningful exit code instead of a traceback."""
    try:
        yield
    except ShardqError as exc:
        code = next((c for t, c in EXIT_CODES.items() if isinstance(exc, t)), EXIT_WORKFLOW)
        fail(str(exc), code)


def emit(settings: Settings, payload: Any, text: str) -> None:
    click.echo(json.dumps(payload, indent=2, default=str) if settings.as_json else text)


@click.group()
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
@click.pass_context
def cli(
    ctx: click.Context, shards: str | None, shards_file: Path | None, as_json: bool, verbose: int
) -> None:
    """shardq: durable workflows on sharded PostgreSQL."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    ctx.obj = Settings(shards, shards_file, as_json)


pass_settings = click.make_pass_decorator(Settings)


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.find_object(Settings).as_json = True  # type: ignore[union-attr]


json_option = click.option(
    "--json", is_flag=True, expose_value=False, callback=_set_json,
    help="Machine-readable output.",
)


@cli.command()
@json_option
@click.option("--shard", "only", multiple=True, help="Migrate only this shard (repeatable).")
@click.option(
    "--migrations-dir",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    hidden=True,
    help="Apply migrations from this folder instead of the packaged schema/ (tests).",
)
@pass_settings
def migrate(settings: Settings, only: tuple[str, ...], migrations_dir: Path | None) -> None:
    """Apply schema/ to every shard (idempotent, safe to race)."""
    from shardq.shards.migrations import load_migrations
    from shardq.shards.migrations import migrate as run_migrations

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        targets = shard_map.named(list(only)) if only else None
        results = run_migrations(
            shard_map, shards=targets, migrations=load_migrations(migrations_dir)
            if migrations_dir else None,
        )
    rows = [
        {"shard": r.shard.name, "applied": r.applied, "schema_version": r.version}
        for r in results
    ]
    text = "\n".join(
        f"{r['shard']}: " + (f"applied {r['applied']}" if r["applied"] else "up to date")
        + f", schema version {r['schema_version']}"
        for r in rows
    )
    emit(settings, {"fingerprint": shard_map.fingerprint, "shards": rows}, text)


@cli.command("shards")
@json_option
@pass_settings
def shards_command(settings: Settings) -> None:
    """Show the shard map, each shard's reachability and schema version."""
    from shardq.shards.config import redact
    from shardq.shards.migrations import check_shard, latest_version

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        required = latest_version()
        statuses = [check_shard(shard_map, s, required=required) for s in shard_map.shards]
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


def main() -> None:
    cli(prog_name="shardq")


if __name__ == "__main__":
    main()

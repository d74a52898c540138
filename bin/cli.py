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
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from shardq.bin.logs import configure as configure_logging
from shardq.shards.config import ENV_SHARDS, ShardMap, load_shard_map
from shardq.shards.errors import (
    ConfigError,
    MapMismatch,
    MigrationError,
    SchemaBehind,
    ShardqError,
    ShardUnavailable,
)

if TYPE_CHECKING:
    from shardq.queue.client import Client
    from shardq.queue.models import Execution
    from shardq.queue.registry import Registry

EXIT_CODES: dict[type[ShardqError], int] = {
    ConfigError: 2,
    ShardUnavailable: 3,
    MapMismatch: 4,
    SchemaBehind: 5,
    MigrationError: 6,
}
EXIT_WORKFLOW = 7
log = logging.getLogger("shardq.cli")
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
    configure_logging(verbose)
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
    "--schema-dir",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    hidden=True,
    help="Apply this folder instead of the packaged schema/ (tests).",
)
@pass_settings
def migrate(settings: Settings, only: tuple[str, ...], schema_dir: Path | None) -> None:
    """Apply schema/ to every shard (idempotent, safe to race)."""
    from shardq.shards.migrations import load_schema
    from shardq.shards.migrations import migrate as run_migrations

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        targets = shard_map.named(list(only)) if only else None
        schema = load_schema(schema_dir) if schema_dir else None
        results = run_migrations(shard_map, shards=targets, schema=schema)
    rows = [
        {"shard": r.shard.name, "applied": r.applied, "functions": r.functions,
         "schema_version": r.version}
        for r in results
    ]
    text = "\n".join(
        f"{r.shard.name}: "
        + (f"applied {r.applied}" if r.applied else "no new migrations")
        + (f", functions {', '.join(r.functions)}" if r.functions else "")
        + f", schema version {r.version}"
        for r in results
    )
    emit(settings, {"fingerprint": shard_map.fingerprint, "shards": rows}, text)


@cli.command("shards")
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


def load_registry(app: str) -> Registry:
    """Import `module:attribute` and return the Registry it names."""
    import importlib

    from shardq.queue.registry import Registry

    module_name, _, attribute = app.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {app}: cannot import {module_name}: {exc}") from None
    registry = getattr(module, attribute or "registry", None)
    if not isinstance(registry, Registry):
        raise ConfigError(f"--app {app}: {attribute or 'registry'} is not a shardq Registry")
    return registry


app_option = click.option(
    "--app", envvar="SHARDQ_APP", default="shardq.bin.examples:registry", show_default=True,
    help="module:attribute of the workflow Registry [env SHARDQ_APP]",
)


@cli.command()
@app_option
@click.option("--shard", "only", multiple=True, help="Serve only this shard (repeatable).")
@click.option("--concurrency", default=10, show_default=True, help="Turns running at once.")
@click.option("--batch-size", default=10, show_default=True, help="Tasks leased per claim.")
@click.option("--lease", "lease_s", default=30.0, show_default=True, help="Lease seconds.")
@click.option("--poll-interval", default=10.0, show_default=True,
              help="Safety poll seconds (NOTIFY and timers wake earlier).")
@click.option("--drain-timeout", default=30.0, show_default=True,
              help="Seconds in-flight turns get after SIGTERM before their leases are released.")
@pass_settings
def worker(
    settings: Settings, app: str, only: tuple[str, ...], concurrency: int, batch_size: int,
    lease_s: float, poll_interval: float, drain_timeout: float,
) -> None:
    """Run workflows: claim due runs on the served shards until SIGTERM."""
    import signal
    import threading

    from shardq.queue.worker import Worker, WorkerConfig, tune_gc_for_worker
    from shardq.shards.migrations import verify_shards
    from shardq.shards.pools import ShardPools

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        served = shard_map.named(list(only)) if only else list(shard_map.shards)
        registry = load_registry(app)
        for status in verify_shards(shard_map, served):
            if not status.reachable:
                log.error("shard unreachable at start; serving the others and retrying it",
                          extra={"shard": status.shard.name, "error": status.problem})
        try:
            config = WorkerConfig(
                concurrency=concurrency, batch_size=batch_size, lease_s=lease_s,
                poll_interval_s=poll_interval, drain_timeout_s=drain_timeout,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    tune_gc_for_worker()  # the application's modules are imported by now
    pools = ShardPools(shard_map).open()
    running = Worker(pools, registry, shards=served, config=config).start()
    click.echo(f"worker {config.owner} serving {', '.join(s.name for s in served)}", err=True)
    stop.wait()
    released = running.stop()
    pools.close()
    click.echo(f"worker stopped ({released} unfinished lease(s) handed back)", err=True)


@cli.group()
def workflow() -> None:
    """Start, signal, inspect and cancel workflow runs."""


@contextmanager
def open_client(settings: Settings, app: str) -> Iterator[Client]:
    from shardq.queue.client import Client

    with errors_as_exit_codes():
        registry = load_registry(app)
        client = Client(settings.shard_map(), registry)
        try:
            yield client
        finally:
            client.close()


def _json_arg(value: str | None, what: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        fail(f"{what} is not valid JSON: {exc}", 2)


def _execution_payload(e: Execution) -> dict[str, Any]:
    from dataclasses import asdict

    return {**asdict(e), "state": e.state.value}


tenant_option = click.option("--tenant", default="default", show_default=True)


@workflow.command("start")
@json_option
@app_option
@tenant_option
@click.argument("name")
@click.argument("workflow_id")
@click.option("--input", "input_json", help="JSON input of the run.")
@pass_settings
def workflow_start(
    settings: Settings, app: str, tenant: str, name: str, workflow_id: str, input_json: str | None
) -> None:
    """Start NAME with the business key WORKFLOW_ID (idempotent on the key)."""
    with open_client(settings, app) as client, errors_as_exit_codes():
        result = client.start(name, workflow_id, _json_arg(input_json, "--input"), tenant=tenant)
    emit(
        settings,
        {"execution_id": str(result.execution_id), "created": result.created,
         "state": result.state.value},
        f"{result.execution_id} {'started' if result.created else 'already exists'} "
        f"({result.state.value})",
    )


@workflow.command("signal")
@json_option
@app_option
@tenant_option
@click.argument("execution_id")
@click.argument("name")
@click.option("--payload", help="JSON payload.")
@click.option("--idempotency-key", help="Repeats with this key are delivered once.")
@pass_settings
def workflow_signal(
    settings: Settings, app: str, tenant: str, execution_id: str, name: str,
    payload: str | None, idempotency_key: str | None,
) -> None:
    """Send signal NAME to a run."""
    with open_client(settings, app) as client, errors_as_exit_codes():
        result = client.signal(
            execution_id, name, _json_arg(payload, "--payload"),
            idempotency_key=idempotency_key, tenant=tenant,
        )
    emit(
        settings,
        {"execution_id": str(result.execution_id), "signal_id": result.signal_id,
         "delivered": result.delivered},
        "delivered" if result.delivered else "duplicate (already delivered with this key)",
    )


@workflow.command("show")
@json_option
@app_option
@tenant_option
@click.argument("execution_id")
@click.option("--history/--no-history", default=True, show_default=True)
@pass_settings
def workflow_show(
    settings: Settings, app: str, tenant: str, execution_id: str, history: bool
) -> None:
    """Show a run and its history."""
    from dataclasses import asdict

    with open_client(settings, app) as client, errors_as_exit_codes():
        execution = client.get(execution_id, tenant=tenant)
        events = client.history(execution.id, tenant=tenant) if history else []
    lines = [
        f"{execution.id}  {execution.workflow_name} v{execution.workflow_version}  "
        f"{execution.workflow_id}  {execution.state.value}"
    ]
    lines += [f"  {e.seq:>6} {e.position if e.position is not None else '-':>4} "
              f"{e.kind:<18} {e.name}  {json.dumps(e.payload)}" for e in events]
    emit(settings, {**_execution_payload(execution), "history": [asdict(e) for e in events]},
         "\n".join(lines))


@workflow.command("list")
@json_option
@app_option
@tenant_option
@click.option("--state", help="Only runs in this state.")
@click.option("--workflow", "workflow_name", help="Only runs of this workflow.")
@click.option("--limit", default=100, show_default=True)
@click.option("--cursor", help="next_cursor of the previous page.")
@pass_settings
def workflow_list(
    settings: Settings, app: str, tenant: str, state: str | None, workflow_name: str | None,
    limit: int, cursor: str | None,
) -> None:
    """List runs over every shard, oldest first, one page at a time."""
    with open_client(settings, app) as client, errors_as_exit_codes():
        try:
            page = client.list(tenant=tenant, state=state, workflow=workflow_name, limit=limit,
                               cursor=cursor)
        except ValueError as exc:
            fail(str(exc), 2)
    lines = [f"{e.id}  {e.workflow_name:<12} {e.workflow_id:<24} {e.state.value}"
             for e in page.items]
    if page.next_cursor:
        lines.append(f"next page: --cursor {page.next_cursor}")
    emit(settings, {"items": [_execution_payload(e) for e in page.items],
                    "next_cursor": page.next_cursor}, "\n".join(lines))


@workflow.command("cancel")
@json_option
@app_option
@tenant_option
@click.argument("execution_id")
@pass_settings
def workflow_cancel(settings: Settings, app: str, tenant: str, execution_id: str) -> None:
    """Cancel a run (at once when parked, at its next checkpoint when running)."""
    with open_client(settings, app) as client, errors_as_exit_codes():
        state = client.cancel(execution_id, tenant=tenant)
    emit(settings, {"execution_id": execution_id, "state": state.value}, state.value)


def main() -> None:
    cli(prog_name="shardq")


if __name__ == "__main__":
    main()

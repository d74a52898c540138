"""An operator's one-shot commands and the store exporter: `migrate`, `stale`, `purge`,
`metrics`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from shardq.bin.cli.common import (
    Seconds,
    Settings,
    app_option,
    check_limit,
    emit,
    emit_partial,
    errors_as_exit_codes,
    json_option,
    load_registry,
    open_client,
    pass_settings,
    retention_option,
    stop_on_signals,
)

if TYPE_CHECKING:
    from shardq.core.models import StaleBounds

F = TypeVar("F", bound=Callable[..., Any])


@click.command()
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
    from shardq.shards.migrations import migrate as run_migrations
    from shardq.shards.schema_files import load_schema

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



def _stale_bounds(
    _ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, float | None]:
    """`--stale-after KIND=SECONDS` (repeatable; `none`: never stale by age alone)."""
    bounds: dict[str, float | None] = {}
    for value in values:
        kind, sep, seconds = value.partition("=")
        if not sep or kind not in STALE_KINDS:
            raise click.BadParameter(f"{value!r}: expected KIND=SECONDS with KIND one of "
                                     f"{', '.join(STALE_KINDS)}", param=param)
        if seconds == "none":
            bounds[kind] = None
            continue
        try:
            bounds[kind] = Seconds().convert(seconds, param, _ctx)
        except click.BadParameter:
            raise click.BadParameter(f"{value!r}: the bound must be a positive number of "
                                     "seconds, or none", param=param) from None
    return bounds


STALE_KINDS = ("timer", "signal", "condition", "interrupt")


def stale_options(f: F) -> F:
    """The bounds that make a wait stale, shared by `stale` and `metrics`."""
    after = click.option(
        "--stale-after", "stale_after", multiple=True, callback=_stale_bounds,
        metavar="KIND=SECONDS",
        help="A wait of KIND open longer than this is stale (repeatable; none: never by age). "
             "Defaults: signal and condition 7 days, interrupt 3 days, timer none.")
    grace = click.option(
        "--deadline-grace", default=300.0, show_default=True, type=Seconds(zero_ok=True),
        help="A wait still open this many seconds past its deadline is stale.")
    return after(grace(f))


def _bounds(stale_after: dict[str, float | None], grace: float) -> StaleBounds:
    from shardq.core.models import StaleBounds

    default = StaleBounds()
    return StaleBounds(
        timer_s=stale_after.get("timer", default.timer_s),
        signal_s=stale_after.get("signal", default.signal_s),
        condition_s=stale_after.get("condition", default.condition_s),
        interrupt_s=stale_after.get("interrupt", default.interrupt_s),
        grace_s=grace,
    )


@click.command("stale")
@json_option
@stale_options
@click.option("--kind", type=click.Choice(STALE_KINDS), help="Only waits of this kind.")
@click.option("--workflow", "workflow_name", help="Only runs of this workflow.")
@click.option("--tenant", help="Only runs of this tenant (default: every tenant).")
@click.option("--limit", default=100, show_default=True, callback=check_limit,
              help="Waits per shard, oldest first, 1..1000.")
@pass_settings
def stale(
    settings: Settings, stale_after: dict[str, float | None], deadline_grace: float,
    kind: str | None, workflow_name: str | None, tenant: str | None, limit: int,
) -> None:
    """List stale waits: open longer than their kind's bound, or past their deadline.

    It surfaces them; it never completes, approves or times out anything. A shard
    that cannot be read is named on stderr (exit 8); the others' waits are shown.
    """
    from dataclasses import asdict

    from shardq.core.rules import check_name
    from shardq.shards.fanout import each_shard

    with open_client(settings) as client, errors_as_exit_codes():
        if workflow_name is not None:
            check_name(workflow_name, "workflow")
        if tenant is not None:
            check_name(tenant, "tenant")
        bounds = _bounds(stale_after, deadline_grace)
        reached = each_shard(client.map.shards, lambda shard: client.store.stale_waits(
            shard, bounds, kind=kind, workflow=workflow_name, tenant=tenant, limit=limit))
        found = sorted((w for waits in reached.answers.values() for w in waits),
                       key=lambda w: -w.age_s)
    lines = [f"{w.execution_id}  {w.tenant}  {w.workflow_name}  {w.kind} {w.name!r}  "
             f"open {w.age_s:.0f} s" + (f", deadline {w.deadline.isoformat()}" if w.deadline
                                         else "") for w in found]
    empty = "no stale waits" + (" on the shards read" if reached.unavailable else "")
    emit_partial(settings, {"stale": [asdict(w) for w in found]},
                 "\n".join(lines) if lines else empty, reached)


@click.command("purge")
@json_option
@app_option
@retention_option
@click.option("--shard", "only", multiple=True, help="Only this shard (repeatable).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@pass_settings
def purge_command(
    settings: Settings, app: str | None, default_retention: float, only: tuple[str, ...],
    dry_run: bool,
) -> None:
    """Delete finished runs past their retention, with their history and signals.

    --app is required: a definition's retention_s keeps its runs longer (or
    shorter) than the default, and runs of workflows the app does not define
    keep the default. Live runs are never touched. A shard that cannot be reached
    is named on stderr (exit 8); the others are purged (or counted) all the same.
    """
    from shardq.shards.fanout import each_shard
    from shardq.worker.retention import RetentionPlan, purge, purgeable

    with errors_as_exit_codes():
        registry = load_registry(app)
    with open_client(settings) as client, errors_as_exit_codes():
        plan = RetentionPlan.of(registry, default_retention)
        shards = client.map.named(list(only)) if only else list(client.map.shards)
        reached = each_shard(shards, lambda shard: (
            purgeable(client.store, shard, plan) if dry_run
            else purge(client.store, shard, plan)))
        counts = {shard.name: n for shard, n in reached.answers.items()}
    verb = "would delete" if dry_run else "deleted"
    lines = [f"{name}: " + ("another purger holds it; nothing done" if n is None
                            else f"{verb} {n} finished run(s)") for name, n in counts.items()]
    emit_partial(settings, {"dry_run": dry_run, "runs": counts}, "\n".join(lines), reached)



@click.command("metrics")
@json_option
@stale_options
@click.option("--port", required=True, type=click.IntRange(1, 65535),
              help="Serve the exporter on this port (/metrics).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--overdue-grace", default=60.0, show_default=True, type=Seconds(zero_ok=True),
              help="A run due this many seconds and not running counts as overdue.")
@click.option("--cache-seconds", default=15.0, show_default=True,
              type=Seconds(zero_ok=True), help="Scrapes within this interval share one read.")
@click.option("--scrape-timeout", default=5.0, show_default=True,
              type=Seconds(minimum=0.1, maximum=120),
              help="A shard that has not answered by then is reported down (up 0).")
@pass_settings
def metrics_command(
    settings: Settings, stale_after: dict[str, float | None], deadline_grace: float, port: int,
    host: str, overdue_grace: float, cache_seconds: float, scrape_timeout: float,
) -> None:
    """Serve per-shard gauges read from the store (waits, stale waits, backlogs) until SIGTERM."""

    from prometheus_client import CollectorRegistry

    from shardq.bin.metrics import StoreCollector, serve
    from shardq.shards.follow import map_poll_interval
    from shardq.shards.pools import ShardPools
    from shardq.store.store import Store

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        bounds = _bounds(stale_after, deadline_grace)
        registry = CollectorRegistry(auto_describe=False)

        # What follows the map (newer versions as moves switch buckets, shards added):
        # each scrape reads the shards of the current version.
        follower = ShardPools(shard_map, timeout=scrape_timeout, probe=True,
                              application_name="shardq-metrics",
                              statement_timeout_s=scrape_timeout,
                              follow_every_s=map_poll_interval()).open()

        def open_store() -> Store:
            # Probing: a shard that refuses connections is reported down at once.
            # A read past the scrape's timeout is abandoned a margin later, whatever
            # the shard's server says: its thread is free for the next scrape.
            return Store(ShardPools(follower.map, timeout=scrape_timeout, probe=True,
                                    application_name="shardq-metrics",
                                    statement_timeout_s=scrape_timeout).open())

        collector = StoreCollector(
            open_store, follower, bounds=bounds, overdue_grace_s=overdue_grace,
            cache_s=cache_seconds, timeout_s=scrape_timeout)
        try:
            registry.register(collector)
            server = serve(registry, host, port)
        except BaseException:
            # Closed here, not by the interpreter's exit: a pool left to its finalizer
            # may print a traceback after the one line that says what went wrong.
            collector.close()
            follower.close()
            raise
    stop = stop_on_signals()
    click.echo(f"store exporter on http://{host}:{port}/metrics for "
               f"{', '.join(s.name for s in shard_map.shards)}", err=True)
    stop.wait()
    server.shutdown()
    collector.close()
    follower.close()


COMMANDS = [migrate, stale, purge_command, metrics_command]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""

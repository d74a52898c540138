"""`shardq worker`: the daemon that runs workflows on the shards it serves."""

from __future__ import annotations

import logging

import click

from shardq.bin.cli.common import (
    Seconds,
    Settings,
    app_option,
    by_rule,
    errors_as_exit_codes,
    exit_if_fatal,
    json_option,
    load_registry,
    metrics_options,
    pass_settings,
    retention_option,
    serve_daemon_metrics,
    stop_on_signals,
)
from shardq.core.builds import check_build_id
from shardq.shards.errors import ConfigError

log = logging.getLogger("shardq.cli")


@click.command()
@json_option
@app_option
@click.option("--shard", "only", multiple=True, help="Serve only this shard (repeatable).")
@click.option("--concurrency", default=10, show_default=True, help="Turns running at once.")
@click.option("--batch-size", default=10, show_default=True, help="Tasks leased per claim.")
@click.option("--lease", "lease_s", default=30.0, show_default=True, type=Seconds(),
              help="Lease seconds.")
@click.option("--poll-interval", default=10.0, show_default=True, type=Seconds(),
              help="Safety poll seconds (NOTIFY and timers wake earlier).")
@click.option("--drain-timeout", default=30.0, show_default=True, type=Seconds(zero_ok=True),
              help="Seconds in-flight turns get after SIGTERM before their leases are released.")
@click.option("--housekeeping-interval", default=300.0, show_default=True,
              type=Seconds(zero_ok=True),
              help="Seconds between purges of finished runs past retention (0: never).")
@click.option("--count-fold-interval", default=5.0, show_default=True,
              type=Seconds(zero_ok=True),
              help="Seconds between folds of the served shards' run count changes "
                   "(0: never; counts stay exact, read more rows).")
@click.option("--build-id", default=None, envvar="SHARDQ_BUILD_ID",
              callback=by_rule(lambda value: None if value is None else check_build_id(value)),
              help="The build of the code in --app: claim runs pinned to it as well as "
                   "unpinned ones (docs/versioning.md). Also SHARDQ_BUILD_ID.")
@retention_option
@metrics_options
@pass_settings
def worker(
    settings: Settings, app: str | None, only: tuple[str, ...], concurrency: int, batch_size: int,
    lease_s: float, poll_interval: float, drain_timeout: float, housekeeping_interval: float,
    count_fold_interval: float, build_id: str | None, default_retention: float,
    metrics_port: int | None, metrics_host: str,
) -> None:
    """Run workflows: claim due runs on the served shards until SIGTERM."""

    from shardq.core.daemons import tune_gc_for_worker
    from shardq.shards.check import verify_shards
    from shardq.shards.pools import ShardPools
    from shardq.store.store import Store
    from shardq.worker.config import WorkerConfig
    from shardq.worker.worker import Worker

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        served = shard_map.named(list(only)) if only else list(shard_map.shards)
        registry = load_registry(app)
        checked = verify_shards(shard_map, served)
        for status in checked:
            if not status.reachable:
                log.error("shard unreachable at start; serving the others and retrying it",
                          extra={"shard": status.shard.name, "error": status.problem})
        try:
            config = WorkerConfig(
                concurrency=concurrency, batch_size=batch_size, lease_s=lease_s,
                poll_interval_s=poll_interval, drain_timeout_s=drain_timeout,
                housekeeping_interval_s=housekeeping_interval,
                count_fold_interval_s=count_fold_interval,
                default_retention_s=default_retention, build_id=build_id,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        serve_daemon_metrics(metrics_host, metrics_port)
    stop = stop_on_signals()
    tune_gc_for_worker()  # the application's modules are imported by now
    # A statement stuck behind a lock, or on a shard too slow to be of use,
    # gives up and is retried, rather than holding a turn thread for good.
    pools = ShardPools(shard_map, statement_timeout_s=60, application_name="shardq-worker",
                       on_fatal=lambda _: stop.set(),
                       verified=checked).open()
    # Without --shard the worker follows the map: it serves a shard a newer version adds.
    running = Worker(Store(pools), registry, shards=served if only else None,
                     config=config).start()
    click.echo(f"worker {config.owner} serving {', '.join(s.name for s in running.shards)}"
               f"{'' if only else ' and the shards the map adds'}"
               f"{f', build {build_id}' if build_id else ''}", err=True)
    stop.wait()
    released = running.stop()
    pools.close()
    click.echo(f"worker stopped ({released} unfinished lease(s) handed back)", err=True)
    exit_if_fatal(pools.fatal)


COMMANDS = [worker]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""

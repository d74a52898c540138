"""The outbox's commands: `outbox-relay`, the daemon that delivers signals sent to runs
of other shards, and `outbox ...`, what the outboxes still owe and re-queueing what failed.

The rows are read and written by the store (store/store.py); the relay's loop is
outbox/relay.py.
"""

from __future__ import annotations

import logging
from typing import Any

import click

from shardq.bin.cli.common import (
    EXIT_WORKFLOW,
    Seconds,
    Settings,
    check_limit,
    emit,
    emit_partial,
    errors_as_exit_codes,
    exit_if_fatal,
    fail,
    json_option,
    metrics_options,
    open_client,
    pass_settings,
    serve_daemon_metrics,
    stop_on_signals,
)
from shardq.shards.errors import ConfigError

log = logging.getLogger("shardq.cli")


@click.command("outbox-relay")
@json_option
@click.option("--shard", "only", multiple=True,
              help="Relay the outbox of this source shard only (repeatable).")
@click.option("--batch-size", default=200, show_default=True, help="Rows claimed per round.")
@click.option("--poll-interval", default=5.0, show_default=True, type=Seconds(),
              help="Safety poll seconds (NOTIFYs of new rows and due retries wake it earlier).")
@click.option("--max-age", "max_age", default=7 * 24 * 3600.0, show_default=True,
              type=Seconds(),
              help="Seconds a row may keep failing transiently before it fails for good.")
@click.option("--max-backoff", default=60.0, show_default=True, type=Seconds(),
              help="Longest wait between two attempts of a row, in seconds.")
@click.option("--delivery-timeout", default=3.0, show_default=True,
              type=Seconds(maximum=600.0),
              help="Seconds a round waits for one target shard; past it the target is "
                   "taken for down and probed until it takes writes again.")
@metrics_options
@pass_settings
def outbox_relay(
    settings: Settings, only: tuple[str, ...], batch_size: int, poll_interval: float,
    max_age: float, max_backoff: float, delivery_timeout: float, metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Deliver signals sent to runs of other shards, until SIGTERM."""

    from shardq.outbox.relay import Relay, RelayConfig
    from shardq.shards.check import verify_shards
    from shardq.shards.pools import ShardPools
    from shardq.store.store import Store

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        sources = shard_map.named(list(only)) if only else list(shard_map.shards)
        # Every shard may be a target: all of them must have this release's schema.
        checked = verify_shards(shard_map)
        for status in checked:
            if not status.reachable:
                log.error("shard unreachable at start; relaying for the others and retrying it",
                          extra={"shard": status.shard.name, "error": status.problem})
        try:
            config = RelayConfig(batch_size=batch_size, poll_interval_s=poll_interval,
                                 max_age_s=max_age, max_backoff_s=max_backoff,
                                 initial_backoff_s=min(0.5, max_backoff),
                                 delivery_timeout_s=delivery_timeout)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        serve_daemon_metrics(metrics_host, metrics_port)
    stop = stop_on_signals()
    # A short wait for a target's connection, so a shard that went down costs a
    # round little; the server ends a transaction a stalled relay left open.
    pools = ShardPools(shard_map, timeout=2.0, application_name="shardq-relay",
                       options="-c idle_in_transaction_session_timeout=60s",
                       statement_timeout_s=30,
                       on_fatal=lambda _: stop.set(),
                       verified=checked).open()
    # Without --shard the relay follows the map: it relays from a shard a version adds.
    relay = Relay(Store(pools), sources=sources if only else None, config=config).start()
    click.echo(f"outbox relay serving {', '.join(s.name for s in relay.sources)}"
               f"{'' if only else ' and the shards the map adds'}", err=True)
    stop.wait()
    relay.stop()
    pools.close()
    counts = ", ".join(f"{k} {v}" for k, v in sorted(relay.counts.items())) or "nothing"
    click.echo(f"outbox relay stopped ({counts})", err=True)
    exit_if_fatal(pools.fatal)


@click.group("outbox", invoke_without_command=True)
@json_option
@click.pass_context
def outbox(ctx: click.Context) -> None:
    """What the outboxes still owe: `status` (the default), `failed`, `retry`."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(outbox_status)


@outbox.command("status")
@json_option
@pass_settings
def outbox_status(settings: Settings) -> None:
    """Per source and target shard: backlog, oldest undelivered age, retrying, failed.

    A shard that cannot be read is named on stderr (exit 8); the others' rows are
    shown, those owed to it included."""
    from shardq.outbox.store import OutboxStore
    from shardq.shards.fanout import each_shard

    with open_client(settings) as client, errors_as_exit_codes():
        rows: list[dict[str, Any]] = []
        reached = each_shard(client.map.shards, OutboxStore(client.store).backlog)
        for source, backlog in reached.answers.items():
            totals: dict[str, dict[str, Any]] = {}
            for b in backlog:
                target = client.map.for_bucket(b.target_bucket).name
                t = totals.setdefault(target, {"source": source.name, "target": target,
                                               "pending": 0, "retrying": 0, "failed": 0,
                                               "oldest_pending_s": None})
                t["pending"] += b.pending
                t["retrying"] += b.retrying
                t["failed"] += b.failed
                if b.oldest_pending_s is not None:
                    t["oldest_pending_s"] = max(t["oldest_pending_s"] or 0.0,
                                                round(b.oldest_pending_s, 3))
            rows += sorted(totals.values(), key=lambda t: t["target"])
    lines = [f"{'source':<12} {'target':<12} {'pending':>8} {'oldest':>9} {'retrying':>9} "
             f"{'failed':>7}"]
    lines += [f"{r['source']:<12} {r['target']:<12} {r['pending']:>8} "
              f"{_age(r['oldest_pending_s']):>9} {r['retrying']:>9} {r['failed']:>7}"
              for r in rows]
    empty = ("every outbox is empty" if not reached.unavailable
             else "the outboxes read are empty")
    emit_partial(settings, {"outbox": rows}, "\n".join(lines) if rows else empty, reached)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


@outbox.command("failed")
@json_option
@click.option("--shard", "only", multiple=True, help="This source shard only (repeatable).")
@click.option("--limit", default=100, show_default=True, callback=check_limit,
              help="Rows per shard, 1..1000.")
@pass_settings
def outbox_failed(settings: Settings, only: tuple[str, ...], limit: int) -> None:
    """List rows that failed for good, with their reason; `retry` re-queues them.

    A shard that cannot be read is named on stderr (exit 8); the others' rows are
    shown."""
    from dataclasses import asdict

    from shardq.outbox.store import OutboxStore
    from shardq.shards.fanout import each_shard

    with open_client(settings) as client, errors_as_exit_codes():
        sources = client.map.named(list(only)) if only else list(client.map.shards)
        outbox_store = OutboxStore(client.store)
        reached = each_shard(sources, lambda s: outbox_store.failures(s, limit=limit))
        found = [(s.name, f) for s, failures in reached.answers.items() for f in failures]
    lines = [f"{shard}  {f.id}  {f.failure_reason}  {f.signal_name!r} from "
             f"{f.source_execution_id} to {f.target_execution_id}: {f.failure_detail}"
             for shard, f in found]
    emit_partial(settings, {"failed": [{"shard": shard, **asdict(f)} for shard, f in found]},
                 "\n".join(lines) if lines else "no failed rows", reached)


@outbox.command("retry")
@json_option
@click.option("--shard", "source", required=True, help="The source shard holding the rows.")
@click.argument("ids", nargs=-1, required=True, type=click.IntRange(1, 2**63 - 1))
@pass_settings
def outbox_retry(settings: Settings, source: str, ids: tuple[int, ...]) -> None:
    """Re-queue failed rows (by id, as `failed` lists them) after fixing their cause.

    All or nothing: when one of the ids is not a failed row of that shard,
    none is re-queued."""
    from shardq.outbox.store import OutboxStore

    with open_client(settings) as client, errors_as_exit_codes():
        (shard,) = client.map.named([source])
        requeued = OutboxStore(client.store).requeue(shard, ids)
    if not requeued:
        missing = ", ".join(str(i) for i in sorted(set(ids)))
        fail(f"no failed outbox row {missing} on {source}: nothing re-queued", EXIT_WORKFLOW)
    emit(settings, {"shard": source, "requeued": sorted(requeued)},
         f"re-queued {len(requeued)} row(s) on {source}")


COMMANDS = [outbox_relay, outbox]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""

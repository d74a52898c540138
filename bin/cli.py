"""The `shardq` command: parse, call one library function, format.

Exit codes (also in the README):
  0 success · 1 unexpected error (a bug: it prints a traceback) · 2 bad usage or
  configuration · 3 a shard is unavailable · 4 shard map mismatch · 5 schema
  behind · 6 a migration failed · 7 a workflow-level refusal · 8 partial: a
  command that reads every shard printed what the reachable ones hold and named
  the shards it could not read (`outbox`, `outbox failed`)

The rule between 2 and 7: a value the command line cannot even parse is a usage
error, 2 (JSON text that is not JSON or holds NaN or an out-of-range number, a
--state that is no state, a cursor that is no cursor, a --limit outside
1..1000, an execution id that is no execution id, an unreadable @file, an
unknown option, a missing or broken --app). A well-formed request the engine
refuses is 7 (unknown workflow, execution not found, signal refused, an invalid
argument the client detects: a bad name, a NUL character or a lone surrogate in
a string).

Every error is one line on stderr, `shardq: error: ...`, or with --json one
JSON object `{"error": "...", "code": N}`, and nothing is stored.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from shardq.bin.loading import ENV_APP, load_registry, shard_map_of
from shardq.bin.logs import configure as configure_logging
from shardq.queue.models import State
from shardq.shards.config import ENV_SHARDS, ShardMap
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
    from shardq.queue.models import Execution, StaleBounds, UpdateResult
    from shardq.queue.registry import Registry
    from shardq.shards.fanout import Reached

EXIT_CODES: dict[type[ShardqError], int] = {
    ConfigError: 2,
    ShardUnavailable: 3,
    MapMismatch: 4,
    SchemaBehind: 5,
    MigrationError: 6,
}
EXIT_USAGE = 2
EXIT_WORKFLOW = 7
EXIT_PARTIAL = 8
log = logging.getLogger("shardq.cli")
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class Settings:
    """What the group's options resolved to; commands pull the shard map lazily."""

    def __init__(
        self, shards: str | None, shards_file: Path | None, as_json: bool, verbose: int
    ) -> None:
        self._shards = shards
        self._shards_file = shards_file
        self.as_json = as_json
        self.verbose = verbose
        self.log_format = "logfmt"

    @property
    def shards(self) -> str | None:
        return self._shards

    @property
    def shards_file(self) -> Path | None:
        return self._shards_file

    def shard_map(self) -> ShardMap:
        return shard_map_of(self._shards, self._shards_file)


def _wants_json() -> bool:
    ctx = click.get_current_context(silent=True)
    settings = ctx.find_object(Settings) if ctx is not None else None
    # A usage error can stop parsing before --json was seen: then the command line says.
    return (settings is not None and settings.as_json) or "--json" in sys.argv[1:]


def fail(message: str, code: int, details: dict[str, Any] | None = None) -> NoReturn:
    """Print one line on stderr (JSON with --json, `details` added) and exit with `code`."""
    line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    if _wants_json():
        click.echo(json.dumps({"error": line, "code": code, **(details or {})}, default=str),
                   err=True)
    else:
        # A lone surrogate (from a command-line value that was not UTF-8) cannot be written
        # to a UTF-8 stream: show it escaped rather than fail while reporting.
        safe = line.encode("utf-8", "backslashreplace").decode("utf-8")
        click.echo(f"shardq: error: {safe}", err=True)
    sys.exit(code)


@contextmanager
def errors_as_exit_codes() -> Iterator[None]:
    """One line on stderr and a meaningful exit code instead of a traceback."""
    try:
        yield
    except ShardqError as exc:
        code = next((c for t, c in EXIT_CODES.items() if isinstance(exc, t)), EXIT_WORKFLOW)
        fail(str(exc), code)


def exit_if_fatal(error: ShardqError | None) -> None:
    """A daemon that stopped because a shard, reached late, holds another map or schema
    exits as it would have at start (4 or 5), with the shard's one-line reason."""
    if error is not None:
        with errors_as_exit_codes():
            raise error


def emit(settings: Settings, payload: Any, text: str) -> None:
    click.echo(json.dumps(payload, indent=2, default=str) if settings.as_json else text)


def emit_partial(settings: Settings, payload: dict[str, Any], text: str,
                 reached: Reached[Any]) -> None:
    """`emit` what the reachable shards hold; then, when a shard could not be read, one
    line on stderr naming it (and its cause) and exit EXIT_PARTIAL: an outage of one
    shard must not hide what the others owe, least of all what they owe it."""
    names = reached.unavailable_names
    emit(settings, {**payload, "unavailable_shards": names}, text)
    if names:
        causes = "; ".join(str(exc) for exc in reached.unavailable.values())
        fail(f"partial: could not read {', '.join(names)} ({causes}); shown: what the "
             "other shards hold", EXIT_PARTIAL, {"unavailable_shards": names})


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


pass_settings = click.make_pass_decorator(Settings)


if TYPE_CHECKING:
    _FloatParam = click.ParamType[float]
else:  # generic only from click 8.2; the project supports 8.1
    _FloatParam = click.ParamType


class Seconds(_FloatParam):
    """A finite number of seconds within bounds: the type of every float option.

    float() and click's FloatRange take `nan` and `inf`, which then reach a
    daemon's timers and the database (a lease of nan claimed nothing forever, one
    of inf ended the heartbeat thread); this refuses them, in one line, before
    anything starts. Positive unless `zero_ok` (0 means "never" or "at once" for
    the options that allow it) or `minimum` says otherwise. The default maximum
    stays below what `threading.Event.wait` accepts.
    """

    name = "seconds"

    def __init__(self, *, zero_ok: bool = False, minimum: float | None = None,
                 maximum: float = 1e9) -> None:
        self.zero_ok = zero_ok
        self.minimum = minimum
        self.maximum = maximum

    def bounds(self) -> str:
        if self.minimum is not None:
            lower = f">= {self.minimum:g}"
        else:
            lower = ">= 0" if self.zero_ok else "> 0"
        return f"{lower} and <= {self.maximum:g}"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        low_ok = (number >= self.minimum if self.minimum is not None
                  else number >= 0 if self.zero_ok else number > 0)
        # Written so that nan fails every comparison; inf fails the maximum.
        if not (low_ok and number <= self.maximum):
            self.fail(f"{value!r} is not a finite number of seconds {self.bounds()}", param, ctx)
        return number


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.find_object(Settings).as_json = True  # type: ignore[union-attr]


def _add_verbosity(ctx: click.Context, _param: click.Parameter, value: int) -> None:
    settings = ctx.find_object(Settings)
    if value and settings is not None:
        settings.verbose += value
        configure_logging(settings.verbose, settings.log_format)


_json_flag = click.option(
    "--json", is_flag=True, expose_value=False, callback=_set_json,
    help="Machine-readable output.",
)
_verbose_flag = click.option(
    "-v", "--verbose", count=True, expose_value=False, callback=_add_verbosity,
    help="Log more (-v info, -vv debug).",
)


def json_option(f: F) -> F:
    """The global --json and -v, accepted after the command too."""
    return _json_flag(_verbose_flag(f))


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


app_option = click.option(
    "--app", envvar=ENV_APP, metavar="MODULE:ATTR",
    help=f"The Registry holding your workflows, e.g. myapp:registry [env {ENV_APP}; required]",
)


retention_option = click.option(
    "--default-retention", default=30 * 86400.0, show_default=True,
    type=Seconds(maximum=1e12),
    help="Seconds a finished run is kept when its definition sets no retention_s.")


def metrics_options(f: F) -> F:
    """--metrics-port and --metrics-host of a daemon."""
    port = click.option("--metrics-port", type=click.IntRange(1, 65535),
                        help="Serve Prometheus metrics on this port (/metrics).")
    host = click.option("--metrics-host", default="127.0.0.1", show_default=True,
                        help="Address the metrics endpoint listens on.")
    return port(host(f))


def serve_daemon_metrics(host: str, port: int | None) -> None:
    """The daemon's own counters and histograms on http://host:port/metrics, if asked."""
    if port is None:
        return
    from shardq.bin.metrics import serve
    from shardq.queue.instruments import REGISTRY

    serve(REGISTRY, host, port)
    click.echo(f"metrics on http://{host}:{port}/metrics", err=True)


@cli.command()
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
@retention_option
@metrics_options
@pass_settings
def worker(
    settings: Settings, app: str | None, only: tuple[str, ...], concurrency: int, batch_size: int,
    lease_s: float, poll_interval: float, drain_timeout: float, housekeeping_interval: float,
    default_retention: float, metrics_port: int | None, metrics_host: str,
) -> None:
    """Run workflows: claim due runs on the served shards until SIGTERM."""
    import signal
    import threading

    from shardq.queue.store import Store
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
                housekeeping_interval_s=housekeeping_interval,
                default_retention_s=default_retention,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        serve_daemon_metrics(metrics_host, metrics_port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    tune_gc_for_worker()  # the application's modules are imported by now
    # A statement stuck behind a lock, or on a shard too slow to be of use,
    # gives up and is retried, rather than holding a turn thread for good.
    pools = ShardPools(shard_map, options="-c statement_timeout=60s",
                       on_fatal=lambda _: stop.set()).open()
    running = Worker(Store(pools), registry, shards=served, config=config).start()
    click.echo(f"worker {config.owner} serving {', '.join(s.name for s in served)}", err=True)
    stop.wait()
    released = running.stop()
    pools.close()
    click.echo(f"worker stopped ({released} unfinished lease(s) handed back)", err=True)
    exit_if_fatal(pools.fatal)


@cli.group()
def workflow() -> None:
    """Start, signal, inspect and cancel workflow runs."""


@contextmanager
def open_client(settings: Settings, registry: Registry | None = None) -> Iterator[Client]:
    """A client whose pools probe each shard on first use: a one-shot command fails at once
    with the shard's cause (refused, no database, bad password), not after a pool timeout."""
    from shardq.queue.client import Client
    from shardq.queue.registry import Registry
    from shardq.queue.store import Store
    from shardq.shards.migrations import verify_shards
    from shardq.shards.pools import ShardPools

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        verify_shards(shard_map)
        pools = ShardPools(shard_map, probe=True).open()
        try:
            # Commands that start nothing need no workflow definitions.
            yield Client(Store(pools), registry or Registry())
        finally:
            pools.close()


@contextmanager
def app_client(settings: Settings, app: str | None) -> Iterator[Client]:
    """open_client with the workflows of `--app` (refused in one line if it will not load)."""
    with errors_as_exit_codes():
        registry = load_registry(app)
    with open_client(settings, registry) as client:
        yield client


def _json_value(_ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """JSON text, `@path` (a UTF-8 file) or `-` (stdin): big inputs need not fit in argv.

    Read by the rules the HTTP API reads bodies by (shardq.bin.web.rules)."""
    from shardq.bin.web.rules import RuleBroken, json_value

    if value is None:
        return None
    try:
        return json_value(_read_value(value, param), "the value")
    except RuleBroken as exc:
        raise click.BadParameter(str(exc).removeprefix("the value "), param=param) from None


def _read_value(value: str, param: click.Parameter) -> str:
    source = "stdin" if value == "-" else value[1:]
    try:
        if value == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        if value.startswith("@"):
            return Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(f"cannot read {source}: {exc.strerror}", param=param) from None
    except UnicodeDecodeError as exc:
        raise click.BadParameter(
            f"{source} is not UTF-8 text (byte {exc.start}: {exc.reason})", param=param
        ) from None
    return value


def _execution_id(_ctx: click.Context, param: click.Parameter, value: str) -> uuid.UUID:
    from shardq.shards.routing import InvalidExecutionId, parse_execution_id

    try:
        return parse_execution_id(value)
    except InvalidExecutionId as exc:
        raise click.BadParameter(str(exc), param=param) from None


def _check_cursor(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """The --cursor of `workflow list` or of `workflow pending` (each pages its own way)."""
    from shardq.queue.errors import InvalidArgument
    from shardq.queue.listing import Cursor, InboxCursor

    decode = InboxCursor.decode if ctx.command.name == "pending" else Cursor.decode
    if value is not None:
        try:
            decode(value)
        except InvalidArgument:
            raise click.BadParameter(
                "is not a cursor: pass the next_cursor a previous page printed", param=param
            ) from None
    return value


def _check_limit(_ctx: click.Context, param: click.Parameter, value: int) -> int:
    from shardq.queue.listing import MAX_PAGE

    if not 1 <= value <= MAX_PAGE:
        raise click.BadParameter(f"{value} is not within 1..{MAX_PAGE}", param=param)
    return value


def _execution_payload(e: Execution) -> dict[str, Any]:
    from dataclasses import asdict

    return {**asdict(e), "state": e.state.value}


def _check_key(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Read by the rules the HTTP API reads the Idempotency-Key header by (shardq.bin.web.rules)."""
    from shardq.bin.web.rules import RuleBroken, idempotency_key

    try:
        return idempotency_key(value, "the key")
    except RuleBroken as exc:
        raise click.BadParameter(str(exc).removeprefix("the key "), param=param) from None


tenant_option = click.option("--tenant", default="default", show_default=True)
execution_id_argument = click.argument("execution_id", callback=_execution_id)
payload_option = click.option(
    "--payload-json", "--payload", "payload", callback=_json_value, metavar="JSON|@FILE|-",
    help="The signal's JSON payload: JSON text, @FILE or - for stdin (--payload is an alias).",
)
start_input_option = click.option(
    "--input", "input_value", callback=_json_value, metavar="JSON|@FILE|-",
    help="The input if the run is started: JSON text, @FILE or - for stdin.")
key_option = click.option(
    "--idempotency-key", callback=_check_key,
    help="Repeats with this key are delivered once (per run).",
)


def _signal_text(delivered: bool, created: bool | None = None) -> str:
    text = "delivered" if delivered else "duplicate (already delivered with this key)"
    return text if created is None else ("started, " if created else "existing run, ") + text


@workflow.command("start")
@json_option
@app_option
@tenant_option
@click.argument("name")
@click.argument("workflow_id")
@click.option("--input", "input_value", callback=_json_value, metavar="JSON|@FILE|-",
              help="The run's input: JSON text, @FILE or - for stdin.")
@pass_settings
def workflow_start(
    settings: Settings, app: str | None, tenant: str, name: str, workflow_id: str,
    input_value: Any,
) -> None:
    """Start NAME with the business key WORKFLOW_ID (idempotent on the key)."""
    with errors_as_exit_codes():
        registry = load_registry(app)
    with open_client(settings, registry) as client, errors_as_exit_codes():
        result = client.start(name, workflow_id, input_value, tenant=tenant)
    emit(
        settings,
        {"execution_id": str(result.execution_id), "created": result.created,
         "state": result.state.value},
        f"{result.execution_id} {'started' if result.created else 'already exists'} "
        f"({result.state.value})",
    )


@workflow.command("signal")
@json_option
@tenant_option
@execution_id_argument
@click.argument("name")
@payload_option
@key_option
@click.option("--app", envvar=ENV_APP, metavar="MODULE:ATTR",
              help="The app's Registry: the payload is checked against the schema the "
                   f"run's workflow publishes for NAME [env {ENV_APP}; optional here].")
@pass_settings
def workflow_signal(
    settings: Settings, tenant: str, execution_id: uuid.UUID, name: str,
    payload: Any, idempotency_key: str | None, app: str | None,
) -> None:
    """Send signal NAME to a run."""
    from shardq.bin.web.rules import send_signal
    from shardq.queue.errors import PayloadInvalid

    with errors_as_exit_codes():
        registry = load_registry(app) if app else None
    with open_client(settings, registry) as client, errors_as_exit_codes():
        result = send_signal(client, execution_id, name, payload, idempotency_key, tenant)
        if isinstance(result.error, PayloadInvalid):
            fail(str(result.error), EXIT_WORKFLOW, {"violations": result.error.violations})
        if result.error is not None:
            raise result.error
    emit(
        settings,
        {"execution_id": str(result.execution_id), "signal_id": result.signal_id,
         "signal_name": result.signal_name, "delivered": result.delivered},
        _signal_text(result.delivered),
    )


@workflow.command("signal-with-start")
@json_option
@app_option
@tenant_option
@click.argument("name")
@click.argument("workflow_id")
@click.argument("signal_name")
@start_input_option
@payload_option
@key_option
@pass_settings
def workflow_signal_with_start(
    settings: Settings, app: str | None, tenant: str, name: str, workflow_id: str,
    signal_name: str, input_value: Any, payload: Any, idempotency_key: str | None,
) -> None:
    """Send SIGNAL_NAME to the run of NAME with key WORKFLOW_ID, starting it if it has none."""
    with errors_as_exit_codes():
        registry = load_registry(app)
    with open_client(settings, registry) as client, errors_as_exit_codes():
        result = client.signal_with_start(
            name, workflow_id, input_value, signal_name, payload,
            idempotency_key=idempotency_key, tenant=tenant,
        )
    emit(
        settings,
        {"execution_id": str(result.execution_id), "created": result.created,
         "signal_id": result.signal_id, "signal_name": result.signal_name,
         "delivered": result.delivered},
        f"{result.execution_id} {_signal_text(result.delivered, result.created)}",
    )


@workflow.command("interface")
@json_option
@app_option
@click.argument("name")
@pass_settings
def workflow_interface(settings: Settings, app: str | None, name: str) -> None:
    """The signals, queries and updates workflow NAME publishes, with their JSON Schemas."""
    with errors_as_exit_codes():
        published = load_registry(app).get(name).interface()
    lines = [f"{kind[:-1]} {entry['name']}" + (f": {entry['description']}"
                                                if "description" in entry else "")
             for kind, entries in published.items() for entry in entries]
    emit(settings, published, "\n".join(lines) or f"{name} publishes nothing")


argument_option = click.option(
    "--arg", "argument", callback=_json_value, metavar="JSON|@FILE|-",
    help="The handler's JSON argument: JSON text, @FILE or - for stdin.")
wait_option = click.option(
    "--wait", default=30.0, show_default=True, type=Seconds(zero_ok=True, maximum=600),
    help="Seconds to wait for the run to handle the update (it stays stored after).")


@workflow.command("query")
@json_option
@app_option
@tenant_option
@execution_id_argument
@click.argument("name")
@argument_option
@pass_settings
def workflow_query(
    settings: Settings, app: str | None, tenant: str, execution_id: uuid.UUID, name: str,
    argument: Any,
) -> None:
    """Answer query NAME from the run's committed state (no worker needed)."""
    with app_client(settings, app) as client, errors_as_exit_codes():
        result = _refusing_payloads(lambda: client.query(execution_id, name, argument,
                                                          tenant=tenant))
    emit(settings, {"result": result}, json.dumps(result, indent=2))


@workflow.command("update")
@json_option
@app_option
@tenant_option
@execution_id_argument
@click.argument("name")
@argument_option
@key_option
@wait_option
@pass_settings
def workflow_update(
    settings: Settings, app: str | None, tenant: str, execution_id: uuid.UUID, name: str,
    argument: Any, idempotency_key: str | None, wait: float,
) -> None:
    """Ask the run to handle update NAME; prints the handler's response once recorded."""
    with app_client(settings, app) as client, errors_as_exit_codes():
        result = _refusing_payloads(lambda: client.update(
            execution_id, name, argument, idempotency_key=idempotency_key, tenant=tenant,
            wait=wait))
    _emit_update(settings, result)


@workflow.command("update-with-start")
@json_option
@app_option
@tenant_option
@click.argument("name")
@click.argument("workflow_id")
@click.argument("update_name")
@start_input_option
@argument_option
@key_option
@wait_option
@pass_settings
def workflow_update_with_start(
    settings: Settings, app: str | None, tenant: str, name: str, workflow_id: str,
    update_name: str, input_value: Any, argument: Any, idempotency_key: str | None,
    wait: float,
) -> None:
    """Update the run of NAME with key WORKFLOW_ID, starting it if it has none."""
    with app_client(settings, app) as client, errors_as_exit_codes():
        result = _refusing_payloads(lambda: client.update_with_start(
            name, workflow_id, input_value, update_name, argument,
            idempotency_key=idempotency_key, tenant=tenant, wait=wait))
    _emit_update(settings, result)


def _refusing_payloads(call: Callable[[], T]) -> T:
    """`call()`; a payload that breaks its schema exits 7 with the violations (--json)."""
    from shardq.queue.errors import PayloadInvalid, UpdateTimedOut

    try:
        return call()
    except PayloadInvalid as exc:
        fail(str(exc), EXIT_WORKFLOW, {"violations": exc.violations})
    except UpdateTimedOut as exc:
        fail(str(exc), EXIT_WORKFLOW, {"update_id": exc.update_id, "completed": False})


def _emit_update(settings: Settings, result: UpdateResult) -> None:
    emit(settings, {"execution_id": str(result.execution_id), "update_id": result.update_id,
                    "response": result.response, "accepted": result.accepted,
                    "created": result.created},
         json.dumps(result.response, indent=2)
         + ("" if result.accepted else "\n(already recorded with this key)"))


@workflow.command("show")
@json_option
@tenant_option
@execution_id_argument
@click.option("--history/--no-history", default=True, show_default=True)
@pass_settings
def workflow_show(settings: Settings, tenant: str, execution_id: uuid.UUID, history: bool) -> None:
    """Show a run: its state, open wait, buffered signals and history."""
    from dataclasses import asdict
    from datetime import UTC, datetime

    with open_client(settings) as client, errors_as_exit_codes():
        view = client.describe(execution_id, tenant=tenant, history=history)
    execution, wait, buffered, events = view.execution, view.wait, view.pending, view.history
    now = datetime.now(UTC)
    lines = [
        f"{execution.id}  {execution.workflow_name} v{execution.workflow_version}  "
        f"{execution.workflow_id}  {execution.state.value}"
    ]
    if wait is not None:
        deadline = f", deadline {wait.deadline.isoformat()}" if wait.deadline else ""
        lines.append(f"  waits on {wait.kind} {wait.name!r} for "
                     f"{(now - wait.started_at).total_seconds():.0f} s{deadline}")
    lines += [f"  buffered signal {b.name!r} (id {b.id}), "
              f"{(now - b.received_at).total_seconds():.0f} s old" for b in buffered]
    lines += [f"  {e.seq:>6} {e.position if e.position is not None else '-':>4} "
              f"{e.kind:<18} {e.name}  {json.dumps(e.payload)}" for e in events]
    emit(settings, {**_execution_payload(execution),
                    "open_wait": asdict(wait) if wait else None,
                    "pending_signals": [asdict(b) for b in buffered],
                    "history": [asdict(e) for e in events]},
         "\n".join(lines))


def page_options(f: F) -> F:
    """--limit and --cursor of a command that lists a page at a time."""
    limit = click.option("--limit", default=100, show_default=True, callback=_check_limit,
                         help="Page size, 1..1000.")
    cursor = click.option("--cursor", callback=_check_cursor,
                          help="next_cursor of the previous page.")
    return limit(cursor(f))


@workflow.command("list")
@json_option
@tenant_option
@click.option("--state", type=click.Choice([s.value for s in State]),
              help="Only runs in this state.")
@click.option("--workflow", "workflow_name", help="Only runs of this workflow.")
@page_options
@pass_settings
def workflow_list(
    settings: Settings, tenant: str, state: str | None, workflow_name: str | None,
    limit: int, cursor: str | None,
) -> None:
    """List runs over every shard, oldest first, one page at a time."""
    with open_client(settings) as client, errors_as_exit_codes():
        page = client.list_runs(tenant=tenant, state=state, workflow=workflow_name, limit=limit,
                           cursor=cursor)
    lines = [f"{e.id}  {e.workflow_name:<12} {e.workflow_id:<24} {e.state.value}"
             for e in page.items]
    if page.next_cursor:
        lines.append(f"next page: --cursor {page.next_cursor}")
    emit(settings, {"items": [_execution_payload(e) for e in page.items],
                    "next_cursor": page.next_cursor}, "\n".join(lines))


@workflow.command("cancel")
@json_option
@tenant_option
@execution_id_argument
@click.option("--actor", help="Who cancels: recorded as the decision of an open interrupt.")
@pass_settings
def workflow_cancel(
    settings: Settings, tenant: str, execution_id: uuid.UUID, actor: str | None
) -> None:
    """Cancel a run (at once when parked, at its next checkpoint when running)."""
    with open_client(settings) as client, errors_as_exit_codes():
        state = client.cancel(execution_id, tenant=tenant, actor=actor)
    emit(settings, {"execution_id": str(execution_id), "state": state.value}, state.value)


@workflow.command("pending")
@json_option
@tenant_option
@click.option("--workflow", "workflow_name", help="Only interrupts of this workflow's runs.")
@page_options
@pass_settings
def workflow_pending(
    settings: Settings, tenant: str, workflow_name: str | None, limit: int, cursor: str | None,
) -> None:
    """List open interrupts (runs waiting for a person) over every shard, oldest first."""
    from dataclasses import asdict
    from datetime import UTC, datetime

    with open_client(settings) as client, errors_as_exit_codes():
        page = client.pending_interrupts(tenant=tenant, workflow=workflow_name, limit=limit,
                                         cursor=cursor)
    now = datetime.now(UTC)
    lines = []
    for p in page.items:
        deadline = f", deadline {p.deadline.isoformat()}" if p.deadline else ""
        waited = (now - p.requested_at).total_seconds()
        lines.append(f"{p.execution_id}  {p.workflow_name} {p.workflow_id}  {p.name}  "
                     f"[{'/'.join(p.actions)}]  waiting {waited:.0f} s{deadline}\n"
                     f"    {p.prompt}")
    if page.next_cursor:
        lines.append(f"next page: --cursor {page.next_cursor}")
    emit(settings, {"items": [asdict(p) for p in page.items], "next_cursor": page.next_cursor},
         "\n".join(lines) if lines else "nothing waits for a decision")


@workflow.command("decide")
@json_option
@tenant_option
@execution_id_argument
@click.argument("interrupt")
@click.option("--action", required=True, type=click.Choice(["approve", "edit", "reject"]))
@click.option(
    "--payload-json", "--payload", "payload", callback=_json_value, metavar="JSON|@FILE|-",
    help="The decision's JSON payload (the edited value for edit): JSON text, @FILE or -.",
)
@click.option("--decision-id", required=True,
              help="Names this decision: sending it again changes nothing.")
@click.option("--actor", required=True, help="Who decides (recorded in the run's history).")
@pass_settings
def workflow_decide(
    settings: Settings, tenant: str, execution_id: uuid.UUID, interrupt: str, action: str,
    payload: Any, decision_id: str, actor: str,
) -> None:
    """Decide the run's open interrupt INTERRUPT: approve, edit or reject."""
    from shardq.queue.errors import DecisionRefused, PayloadInvalid

    with open_client(settings) as client, errors_as_exit_codes():
        try:
            result = client.decide(execution_id, interrupt, action, payload,
                                   decision_id=decision_id, actor=actor, tenant=tenant)
        except PayloadInvalid as exc:
            fail(str(exc), EXIT_WORKFLOW, {"violations": exc.violations})
        except DecisionRefused as exc:
            fail(str(exc), EXIT_WORKFLOW,
                 {"reason_code": exc.reason_code, "standing": exc.standing})
    decision = result.decision
    emit(settings, {"execution_id": str(execution_id), "accepted": result.accepted,
                    "decision": decision.as_json()},
         f"{decision.action} by {decision.actor} "
         + ("accepted" if result.accepted else "(already recorded: nothing changed)"))


@cli.command("outbox-relay")
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
@metrics_options
@pass_settings
def outbox_relay(
    settings: Settings, only: tuple[str, ...], batch_size: int, poll_interval: float,
    max_age: float, max_backoff: float, metrics_port: int | None, metrics_host: str,
) -> None:
    """Deliver signals sent to runs of other shards, until SIGTERM."""
    import signal
    import threading

    from shardq.outbox.relay import Relay, RelayConfig
    from shardq.queue.store import Store
    from shardq.shards.migrations import verify_shards
    from shardq.shards.pools import ShardPools

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        sources = shard_map.named(list(only)) if only else list(shard_map.shards)
        # Every shard may be a target: all of them must have this release's schema.
        for status in verify_shards(shard_map):
            if not status.reachable:
                log.error("shard unreachable at start; relaying for the others and retrying it",
                          extra={"shard": status.shard.name, "error": status.problem})
        try:
            config = RelayConfig(batch_size=batch_size, poll_interval_s=poll_interval,
                                 max_age_s=max_age, max_backoff_s=max_backoff,
                                 initial_backoff_s=min(0.5, max_backoff))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        serve_daemon_metrics(metrics_host, metrics_port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # A short wait for a target's connection, so a shard that went down costs a
    # round little; the server ends a transaction a stalled relay left open.
    pools = ShardPools(shard_map, timeout=2.0, application_name="shardq-relay",
                       options="-c idle_in_transaction_session_timeout=60s "
                               "-c statement_timeout=30s",
                       on_fatal=lambda _: stop.set()).open()
    relay = Relay(Store(pools), sources=sources, config=config).start()
    click.echo(f"outbox relay serving {', '.join(s.name for s in sources)}", err=True)
    stop.wait()
    relay.stop()
    pools.close()
    counts = ", ".join(f"{k} {v}" for k, v in sorted(relay.counts.items())) or "nothing"
    click.echo(f"outbox relay stopped ({counts})", err=True)
    exit_if_fatal(pools.fatal)


@cli.group("outbox", invoke_without_command=True)
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
    from shardq.shards.fanout import each_shard

    with open_client(settings) as client, errors_as_exit_codes():
        rows: list[dict[str, Any]] = []
        reached = each_shard(client.map.shards, client.store.outbox_backlog)
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
@click.option("--limit", default=100, show_default=True, callback=_check_limit,
              help="Rows per shard, 1..1000.")
@pass_settings
def outbox_failed(settings: Settings, only: tuple[str, ...], limit: int) -> None:
    """List rows that failed for good, with their reason; `retry` re-queues them.

    A shard that cannot be read is named on stderr (exit 8); the others' rows are
    shown."""
    from dataclasses import asdict

    from shardq.shards.fanout import each_shard

    with open_client(settings) as client, errors_as_exit_codes():
        sources = client.map.named(list(only)) if only else list(client.map.shards)
        reached = each_shard(sources, lambda s: client.store.outbox_failures(s, limit=limit))
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
    with open_client(settings) as client, errors_as_exit_codes():
        (shard,) = client.map.named([source])
        requeued = client.store.requeue_outbox(shard, ids)
    if not requeued:
        missing = ", ".join(str(i) for i in sorted(set(ids)))
        fail(f"no failed outbox row {missing} on {source}: nothing re-queued", EXIT_WORKFLOW)
    emit(settings, {"shard": source, "requeued": sorted(requeued)},
         f"re-queued {len(requeued)} row(s) on {source}")


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
    from shardq.queue.models import StaleBounds

    default = StaleBounds()
    return StaleBounds(
        timer_s=stale_after.get("timer", default.timer_s),
        signal_s=stale_after.get("signal", default.signal_s),
        condition_s=stale_after.get("condition", default.condition_s),
        interrupt_s=stale_after.get("interrupt", default.interrupt_s),
        grace_s=grace,
    )


@cli.command("stale")
@json_option
@stale_options
@click.option("--kind", type=click.Choice(STALE_KINDS), help="Only waits of this kind.")
@click.option("--workflow", "workflow_name", help="Only runs of this workflow.")
@click.option("--tenant", help="Only runs of this tenant (default: every tenant).")
@click.option("--limit", default=100, show_default=True, callback=_check_limit,
              help="Waits per shard, oldest first, 1..1000.")
@pass_settings
def stale(
    settings: Settings, stale_after: dict[str, float | None], deadline_grace: float,
    kind: str | None, workflow_name: str | None, tenant: str | None, limit: int,
) -> None:
    """List stale waits: open longer than their kind's bound, or past their deadline.

    It surfaces them; it never completes, approves or times out anything.
    """
    from dataclasses import asdict

    from shardq.queue.names import check_name

    with open_client(settings) as client, errors_as_exit_codes():
        if workflow_name is not None:
            check_name(workflow_name, "workflow")
        if tenant is not None:
            check_name(tenant, "tenant")
        bounds = _bounds(stale_after, deadline_grace)
        found = sorted(
            (w for shard in client.map.shards for w in client.store.stale_waits(
                shard, bounds, kind=kind, workflow=workflow_name, tenant=tenant, limit=limit)),
            key=lambda w: -w.age_s)
    lines = [f"{w.execution_id}  {w.tenant}  {w.workflow_name}  {w.kind} {w.name!r}  "
             f"open {w.age_s:.0f} s" + (f", deadline {w.deadline.isoformat()}" if w.deadline
                                         else "") for w in found]
    emit(settings, {"stale": [asdict(w) for w in found]},
         "\n".join(lines) if lines else "no stale waits")


@cli.command("purge")
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
    keep the default. Live runs are never touched.
    """
    from shardq.queue.retention import RetentionPlan, purge, purgeable

    with errors_as_exit_codes():
        registry = load_registry(app)
    with open_client(settings) as client, errors_as_exit_codes():
        plan = RetentionPlan.of(registry, default_retention)
        shards = client.map.named(list(only)) if only else list(client.map.shards)
        counts = {
            shard.name: (purgeable(client.store, shard, plan) if dry_run
                         else purge(client.store, shard, plan))
            for shard in shards
        }
    verb = "would delete" if dry_run else "deleted"
    lines = [f"{name}: " + ("another purger holds it; nothing done" if n is None
                            else f"{verb} {n} finished run(s)") for name, n in counts.items()]
    emit(settings, {"dry_run": dry_run, "runs": counts}, "\n".join(lines))


@cli.command("api-token")
@json_option
@click.argument("tenant")
@pass_settings
def api_token(settings: Settings, tenant: str) -> None:
    """Make a bearer token for TENANT: the token once, and its line for the tokens file."""
    from shardq.bin.web.tokens import hash_token, new_token
    from shardq.queue.names import check_name

    with errors_as_exit_codes():
        check_name(tenant, "tenant")
    token = new_token()
    line = f"{tenant} {hash_token(token)}"
    emit(settings, {"tenant": tenant, "token": token, "tokens_file_line": line},
         f"token (shown once): {token}\nadd to the tokens file: {line}")


@cli.command("serve")
@app_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option("--tokens-file", required=True, envvar="SHARDQ_TOKENS_FILE",
              type=click.Path(path_type=Path, dir_okay=False),
              help="`TENANT sha256:HEX` per line (shardq api-token) [env SHARDQ_TOKENS_FILE]")
@click.option("--inbox-stale-after", default=86400.0, show_default=True,
              type=Seconds(),
              help="Seconds after which the inbox marks an open interrupt stale.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Server processes sharing the port, each with its own pools.")
@pass_settings
def serve_command(
    settings: Settings, app: str | None, host: str, port: int, tokens_file: Path,
    inbox_stale_after: float, workers: int,
) -> None:
    """Serve the HTTP management API under /api/shardq and the review inbox under /inbox
    until SIGTERM."""
    import os
    import socket

    import uvicorn

    from shardq.bin.web.serving import ENV_CONFIG, ServeConfig, build_app, checked

    config = ServeConfig(app, str(tokens_file), settings.shards,
                         str(settings.shards_file) if settings.shards_file else None,
                         inbox_stale_after)
    with errors_as_exit_codes():
        # Every process would refuse the same way: checked once, here, in one line.
        checked(config)
        try:  # refused here, in one line, rather than by uvicorn's own logging
            with socket.create_server((host, port)):
                pass
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    options: dict[str, Any] = {"host": host, "port": port, "log_level": "warning",
                               "access_log": False, "server_header": False}
    click.echo(f"shardq API on http://{host}:{port}/api/shardq", err=True)
    if workers == 1:
        with errors_as_exit_codes():
            application = build_app(config)
        uvicorn.run(application, **options)
    else:
        os.environ[ENV_CONFIG] = config.to_env()
        uvicorn.run("shardq.bin.web.serving:app_from_environment", factory=True, workers=workers,
                    **options)


@cli.command("metrics")
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
    import signal
    import threading

    from prometheus_client import CollectorRegistry

    from shardq.bin.metrics import StoreCollector, serve
    from shardq.queue.store import Store
    from shardq.shards.pools import ShardPools

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        bounds = _bounds(stale_after, deadline_grace)
        registry = CollectorRegistry(auto_describe=False)

        def open_store() -> Store:
            # Probing: a shard that refuses connections is reported down at once.
            return Store(ShardPools(shard_map, timeout=scrape_timeout, probe=True,
                                    application_name="shardq-metrics").open())

        collector = StoreCollector(
            open_store, shard_map, bounds=bounds, overdue_grace_s=overdue_grace,
            cache_s=cache_seconds, timeout_s=scrape_timeout)
        try:
            registry.register(collector)
            server = serve(registry, host, port)
        except BaseException:
            # Closed here, not by the interpreter's exit: a pool left to its finalizer
            # may print a traceback after the one line that says what went wrong.
            collector.close()
            raise
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    click.echo(f"store exporter on http://{host}:{port}/metrics for "
               f"{', '.join(s.name for s in shard_map.shards)}", err=True)
    stop.wait()
    server.shutdown()
    collector.close()


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


@cli.group(invoke_without_command=True)
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
    import signal
    import threading

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
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
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


if __name__ == "__main__":
    main()

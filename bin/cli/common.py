"""What every `shardq` command shares: its settings, its options, and how it fails.

Exit codes (also in docs/cli.md):
  0 success · 1 unexpected error (a bug: it prints a traceback) · 2 bad usage or
  configuration · 3 a shard is unavailable · 4 shard map mismatch · 5 schema
  behind · 6 a migration failed · 7 a workflow-level refusal · 8 partial: a
  command that reads every shard printed what the reachable ones hold and named
  the shards it could not read (`outbox`, `outbox failed`, `stale`, `workflow
  list`, `workflow pending`, `purge`) · 9 the map is being changed · 10 `replay` found
  runs whose history the code no longer replays

The rule between 2 and 7: a value the command line cannot even parse is a usage
error, 2 (JSON text that is not JSON or holds NaN, an out-of-range number or a
key twice in one object, a
--state that is no state, a cursor that is no cursor, a --limit outside
1..1000, an execution id that is no execution id, an unreadable @file, an
unknown option, a missing or broken --app). A well-formed request the engine
refuses is 7 (unknown workflow, execution not found, signal refused, an invalid
argument the client detects: a bad name, a NUL character or a lone surrogate in
a string).

Every error is one line on stderr, `shardq: error: ...`, or with --json one
JSON object `{"error": "...", "code": N}`, and nothing is stored.

Only what `shardq --help` needs is imported at the top of the command modules;
each command imports the rest when it runs.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from shardq.bin.loading import ENV_APP, load_registry, shard_map_of
from shardq.bin.logs import configure as configure_logging
from shardq.shards.config import ShardMap
from shardq.shards.errors import (
    ConfigError,
    MapMismatch,
    MigrationError,
    MoveRunning,
    SchemaBehind,
    ShardqError,
    ShardUnavailable,
)

if TYPE_CHECKING:
    from shardq.client.client import Client
    from shardq.shards.fanout import Reached
    from shardq.store.counts import RunCounts
    from shardq.store.listing import PartialInterruptPage, PartialPage
    from shardq.workflow.registry import Registry

    Unread = PartialPage | PartialInterruptPage | RunCounts

EXIT_CODES: dict[type[ShardqError], int] = {
    ConfigError: 2,
    ShardUnavailable: 3,
    MapMismatch: 4,
    SchemaBehind: 5,
    MigrationError: 6,
    MoveRunning: 9,
}
EXIT_USAGE = 2
EXIT_WORKFLOW = 7
EXIT_PARTIAL = 8
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


pass_settings = click.make_pass_decorator(Settings)


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
                 reached: Reached[Any] | Unread, *, asked: int | None = None) -> None:
    """`emit` what the reachable shards hold; then, when a shard could not be read, one
    line on stderr naming it (and its cause) and exit EXIT_PARTIAL: an outage of one
    shard must not hide what the others owe, least of all what they owe it.

    `reached` is what `shards.fanout.each_shard` read, or a page or counts the client
    read that way (`list_runs`, `pending_interrupts` and `count_runs` with
    `skip_unavailable`; then
    `asked` says how many shards it read). When no shard could be read there is
    nothing partial to show: the command fails as any other does when a shard is
    unavailable (exit 3), with the shards' causes."""
    from shardq.shards.fanout import Reached

    if isinstance(reached, Reached):
        names, asked = reached.unavailable_names, len(reached.answers) + len(reached.unavailable)
    else:
        names = list(reached.unavailable_shards)
    causes = "; ".join(reached.causes)
    if names and len(names) == asked:
        fail(causes, EXIT_CODES[ShardUnavailable])
    emit(settings, {**payload, "unavailable_shards": names}, text)
    if names:
        fail(f"partial: could not read {', '.join(names)} ({causes}); shown: what the "
             "other shards hold", EXIT_PARTIAL, {"unavailable_shards": names})


# -- options ---------------------------------------------------------------------


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


app_option = click.option(
    "--app", envvar=ENV_APP, metavar="MODULE:ATTR",
    help=f"The Registry holding your workflows, e.g. myapp:registry [env {ENV_APP}; required]",
)


retention_option = click.option(
    "--default-retention", default=30 * 86400.0, show_default=True,
    type=Seconds(maximum=1e12),
    help="Seconds a finished run is kept when its definition sets no retention_s.")


def by_rule(check: Callable[[Any], T]) -> Callable[[click.Context, click.Parameter, Any], T]:
    """A click callback applying one of the engine's checks (core/rules.py) to a value:
    what a client would refuse with InvalidArgument is a usage error here (exit 2), in
    the same words."""
    from shardq.core.errors import InvalidArgument

    def callback(_ctx: click.Context, param: click.Parameter, value: Any) -> T:
        try:
            return check(value)
        except InvalidArgument as exc:
            raise click.BadParameter(str(exc), param=param) from None

    return callback


def check_moment(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """An option's ISO 8601 time with its offset (core/rules.parse_moment), or None."""
    from shardq.core.rules import parse_moment

    return None if value is None else by_rule(parse_moment)(ctx, param, value)


def _attribute_filters(values: tuple[str, ...]) -> tuple[Any, ...]:
    from shardq.core.attributes import check_filters

    return check_filters(list(values))


where_option = click.option(
    "--where", multiple=True, metavar="NAME=VALUE", callback=by_rule(_attribute_filters),
    help="Only runs with this search attribute: NAME OP VALUE, OP one of = < <= > >= "
         "(VALUE read as JSON when it is a number, true, false or a \"string\"); "
         "repeat for several, all met.")


def check_limit(_ctx: click.Context, param: click.Parameter, value: int) -> int:
    """A --limit of rows per page or per shard: 1..MAX_PAGE."""
    from shardq.store.listing import MAX_PAGE

    if not 1 <= value <= MAX_PAGE:
        raise click.BadParameter(f"{value} is not within 1..{MAX_PAGE}", param=param)
    return value


def metrics_options(f: F) -> F:
    """--metrics-port and --metrics-host of a daemon."""
    port = click.option("--metrics-port", type=click.IntRange(1, 65535),
                        help="Serve Prometheus metrics on this port (/metrics).")
    host = click.option("--metrics-host", default="127.0.0.1", show_default=True,
                        help="Address the metrics endpoint listens on.")
    return port(host(f))


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: what a long-running command waits on to stop."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def serve_daemon_metrics(host: str, port: int | None) -> None:
    """The daemon's own counters and histograms on http://host:port/metrics, if asked."""
    if port is None:
        return
    from shardq.bin.metrics import serve
    from shardq.core.instruments import REGISTRY

    serve(REGISTRY, host, port)
    click.echo(f"metrics on http://{host}:{port}/metrics", err=True)


# -- clients ---------------------------------------------------------------------


@contextmanager
def open_client(settings: Settings, registry: Registry | None = None) -> Iterator[Client]:
    """A client whose pools probe each shard on first use: a one-shot command fails at once
    with the shard's cause (refused, no database, bad password), not after a pool timeout."""
    from shardq.client.client import Client
    from shardq.shards.check import verify_shards
    from shardq.shards.pools import ShardPools
    from shardq.store.store import Store
    from shardq.workflow.registry import Registry

    with errors_as_exit_codes():
        shard_map = settings.shard_map()
        checked = verify_shards(shard_map)
        # The statuses carry each seed's newest map version: the command routes by the newest.
        pools = ShardPools(shard_map, probe=True, verified=checked).open()
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


__all__ = [
    "ENV_APP", "EXIT_CODES", "EXIT_PARTIAL", "EXIT_USAGE", "EXIT_WORKFLOW", "Seconds",
    "Settings", "app_client", "app_option", "check_limit", "emit", "emit_partial",
    "errors_as_exit_codes", "exit_if_fatal", "fail", "json_option", "load_registry",
    "metrics_options", "open_client", "pass_settings", "retention_option",
    "serve_daemon_metrics",
]

"""`shardq shards move` and `shardq shards rebalance`: moving bucket ranges between shards.

Registered into the `shards` group (bin/cli/shards.py) by `register`.

A move returns once its last batch has switched and the source's copy of the moved
runs is deleted, which waits for the grace period (`--grace`, 60 s: reads planned on
the previous map version finish against the copy) and says so while it waits.
`--no-wait` returns at the last switch; the copy is then deleted by
`shards move --resume` (which waits for what is left of the grace period) or by the
next move or rebalance, and `shards status` shows it until then. A rebalance waits
for one grace period after its last move, not one per move.

Exit codes: those of common.py (2 usage or configuration, 3 a shard unavailable,
4 map, 5 schema) and EXIT_MOVE_RUNNING, 9: another move holds the mover's lock,
or an unfinished move must be resumed (`--resume`) or aborted (`--abort`) first.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import click

from shardq.bin.cli.common import (
    EXIT_CODES,
    EXIT_USAGE,
    Seconds,
    Settings,
    emit,
    errors_as_exit_codes,
    fail,
    json_option,
    pass_settings,
)
from shardq.shards.errors import MoveRunning

EXIT_MOVE_RUNNING = EXIT_CODES[MoveRunning]


def _positive(_ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and not 1 <= value <= 10_000_000:
        raise click.BadParameter(f"{value} is not within 1..10000000", param=param)
    return value


def _move_options(f: Any) -> Any:
    for option in reversed([
        click.option("--batch-runs", type=int, default=1000, show_default=True,
                     callback=_positive, help="Most runs in one batch (one pause)."),
        click.option("--batch-rows", type=int, default=50_000, show_default=True,
                     callback=_positive, help="Most rows, over the six tables, in one batch."),
        click.option("--fence-wait", type=Seconds(maximum=3600), default=1.0,
                     show_default=True,
                     help="Seconds to wait for writers of a frozen batch before unfreezing "
                          "and retrying."),
        click.option("--max-pause", type=Seconds(zero_ok=True, maximum=3600), default=1.0,
                     show_default=True,
                     help="A batch paused longer than this halves the size of the batches "
                          "after it, down to one run (0: never)."),
        click.option("--grace", type=Seconds(zero_ok=True), default=60.0, show_default=True,
                     help="Seconds between a batch's switch and deleting the source's copy."),
        click.option("--rest", type=Seconds(zero_ok=True, maximum=100), default=1.0,
                     show_default=True,
                     help="After each batch and cleanup chunk, rest this many times as long "
                          "as it took (0: full speed), leaving the servers to their traffic."),
        click.option("--no-wait", is_flag=True,
                     help="Return when the last batch has switched, without waiting for "
                          "the grace period to delete the source's copy (`shards move "
                          "--resume` or the next move deletes it)."),
    ]):
        f = option(f)
    return f


def _options(batch_runs: int, batch_rows: int, fence_wait: float, max_pause: float,
             grace: float, rest: float) -> Any:
    from shardq.moves.models import MoveOptions

    return MoveOptions(max_batch_runs=batch_runs, max_batch_rows=batch_rows,
                       fence_wait_s=fence_wait, max_pause_s=max_pause, grace_s=grace,
                       rest=rest)


def _progress(settings: Settings) -> Any:
    return None if settings.as_json else (lambda line: click.echo(line, err=True))


def _text(result: dict[str, Any]) -> str:
    first, last = result["buckets"]
    batches = result["batches"]
    rolled_back = sum(b["phase"] == "rolled_back" for b in batches)
    pause = ("no batch paused" if result["max_pause_ms"] is None
             else f"longest pause {result['max_pause_ms']} ms")
    text = (f"move {result['move']} {result['phase']}: buckets {first}-{last} from "
            f"{result['source']} to {result['target']}, {result['runs_moved']} runs in "
            f"{len(batches) - rolled_back} batch(es)"
            + (f" ({rolled_back} rolled back, left on {result['source']})" if rolled_back
               else "")
            + f", {result['seconds']} s, {pause}, map version {result['map_version']}")
    return text + _cleanup_text(result["cleanup"])


def _cleanup_text(cleanup: dict[str, Any]) -> str:
    text = ""
    if cleanup["batches_cleaned"]:
        text += (f"; copies of {cleanup['batches_cleaned']} switched batch(es) deleted "
                 f"({cleanup['deleted_runs']} runs)")
    if cleanup["pending"]:
        sources = ", ".join(sorted({p["source"] for p in cleanup["pending"]}))
        last = max(dt.datetime.fromisoformat(p["due_at"]) for p in cleanup["pending"])
        due = f"{last.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
        text += (f"; {sources} keeps its copy of {len(cleanup['pending'])} switched batch(es) "
                 f"until its grace period ends ({due}): `shardq shards move --resume` deletes "
                 "it then, and so does the next move or rebalance")
    return text


def _run_guarded(action: Any) -> Any:
    try:
        with errors_as_exit_codes():  # MoveRunning: EXIT_MOVE_RUNNING
            return action()
    except KeyboardInterrupt:
        fail("interrupted: the move stopped where it was (`shardq shards status` shows "
             "what is left); `shardq shards move --resume` finishes it, `--abort` rolls back "
             "the batches that did not switch", 1)


@click.command("move")
@click.argument("buckets", required=False, metavar="FIRST-LAST")
@click.option("--to", "target", metavar="NAME", help="The shard to move the buckets to.")
@click.option("--resume", is_flag=True,
              help="Finish the unfinished move, or delete the copies a finished one left.")
@click.option("--abort", is_flag=True,
              help="Roll back the unfinished move's batches that did not switch.")
@_move_options
@json_option
@pass_settings
def move_command(settings: Settings, buckets: str | None, target: str | None, resume: bool,
                 abort: bool, batch_runs: int, batch_rows: int, fence_wait: float,
                 max_pause: float, grace: float, rest: float, no_wait: bool) -> None:
    """Move buckets FIRST-LAST (or one bucket N) to shard NAME, online, batch by batch."""
    from shardq.moves.mover import move
    from shardq.moves.plan import parse_range

    if resume and abort:
        fail("--resume and --abort exclude each other", EXIT_USAGE)
    first = last = None
    if resume or abort:
        if buckets is not None or target is not None:
            fail(f"--{'resume' if resume else 'abort'} takes no range and no --to: it "
                 "finishes the unfinished move", EXIT_USAGE)
    else:
        if buckets is None or not target:
            fail("give a bucket range and --to NAME (e.g. `shards move 0-1023 --to shard-2`)",
                 EXIT_USAGE)
        with errors_as_exit_codes():
            first, last = parse_range(buckets)
    with errors_as_exit_codes():
        options = _options(batch_runs, batch_rows, fence_wait, max_pause, grace, rest)
        seeds = settings.shard_map()
    result = _run_guarded(lambda: move(seeds, first, last, target, options, resume=resume,
                                       abort=abort, wait=not no_wait,
                                       progress=_progress(settings)))
    doc = result.as_dict()
    emit(settings, doc, _text(doc))


@click.command("rebalance")
@click.option("--dry-run", is_flag=True, help="Print the plan; move nothing.")
@_move_options
@json_option
@pass_settings
def rebalance_command(settings: Settings, dry_run: bool, batch_runs: int, batch_rows: int,
                      fence_wait: float, max_pause: float, grace: float, rest: float,
                      no_wait: bool) -> None:
    """Even out runs per shard: moves of bucket ranges from the fullest to the emptiest.

    Even: every shard's runs within 10% of the mean, or as even as whole buckets allow.
    """
    from shardq.moves.mover import clean_up, move, rebalance_plan
    from shardq.moves.plan import within_tolerance

    with errors_as_exit_codes():
        options = _options(batch_runs, batch_rows, fence_wait, max_pause, grace, rest)
        seeds = settings.shard_map()
    dep, plan, runs = _run_guarded(lambda: rebalance_plan(seeds))
    if len(dep.names) < 2:
        fail(f"rebalance needs two shards or more; the map has {', '.join(dep.names)}",
             EXIT_USAGE)
    planned = [m.as_dict() for m in plan]
    after = dict(runs)
    for m in plan:
        after[m.source] -= m.runs
        after[m.target] += m.runs
    lines = [f"map version {dep.version}; runs per shard: "
             + ", ".join(f"{n} {c}" for n, c in runs.items())]
    lines += [f"  move {m.first}-{m.last} from {m.source} to {m.target} ({m.runs} runs)"
              for m in plan] or [f"  nothing to move: {_evenness(runs)}"]
    if plan:
        lines.append("  afterwards: " + ", ".join(f"{n} {c}" for n, c in after.items())
                     + f": {_evenness(after)}")
    if dry_run:
        emit(settings, {"map_version": dep.version, "runs": runs, "plan": planned,
                        "runs_after": after, "even_after": within_tolerance(after),
                        "dry_run": True}, "\n".join(lines))
        return
    if not settings.as_json:
        click.echo("\n".join(lines), err=True)
    # Each move returns at its last switch; the copies wait for one grace period, at the end.
    done = [_run_guarded(lambda m=m: move(seeds, m.first, m.last, m.target, options,
                                          wait=False, progress=_progress(settings))).as_dict()
            for m in plan]
    cleanup = _run_guarded(lambda: clean_up(seeds, options, wait=not no_wait,
                                            progress=_progress(settings))).as_dict()
    text = "\n".join(_text({**d, "cleanup": _NO_CLEANUP}) for d in done)
    emit(settings, {"runs": runs, "plan": planned, "moves": done, "cleanup": cleanup,
                    "runs_after": after, "even_after": within_tolerance(after),
                    "dry_run": False},
         (text + "\nrebalanced" + _cleanup_text(cleanup)) if done
         else f"nothing to move: {_evenness(runs)}" + _cleanup_text(cleanup))


_NO_CLEANUP = {"batches_cleaned": 0, "pending": []}


def _evenness(runs: dict[str, int]) -> str:
    """What "even" means, said of these loads (docs/operations.md, "Growing")."""
    from shardq.moves.plan import TOLERANCE, within_tolerance

    if within_tolerance(runs):
        return f"the shards are even (each within {TOLERANCE:.0%} of the mean)"
    return (f"not within {TOLERANCE:.0%} of the mean, but as even as whole buckets allow "
            "(a bucket never splits, and no range at the end of a fuller shard's range "
            "would bring two shards closer)")


def register(group: click.Group) -> None:
    """Add the move commands to the `shards` group."""
    group.add_command(move_command)
    group.add_command(rebalance_command)


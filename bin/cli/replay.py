"""`shardq replay` (recorded histories replayed against the code in --app) and
`shardq history export` (one run's history as a JSON file a test can keep).

Exit codes of `replay` (docs/cli.md): 0 every run replayed, 10 some diverged (each
printed, the first differing position named), 2 bad usage (a file that is no
exported history, an --app that will not load), 3 a shard unavailable.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from shardq.bin.cli.common import (
    EXIT_USAGE,
    Settings,
    app_client,
    app_option,
    check_moment,
    emit,
    errors_as_exit_codes,
    fail,
    json_option,
    load_registry,
    open_client,
    pass_settings,
)
from shardq.bin.cli.workflow import execution_id_argument, tenant_option
from shardq.core.models import State

if TYPE_CHECKING:
    from shardq.workflow.exported import RecordedRun
    from shardq.workflow.replayer import Verdict

EXIT_DIVERGED = 10


def _builds(_ctx: click.Context, param: click.Parameter,
            value: tuple[str, ...]) -> tuple[str, ...]:
    from shardq.core.builds import check_build_id
    from shardq.core.errors import InvalidArgument

    try:
        return tuple(check_build_id(v) for v in value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc), param=param) from None


@click.command("replay")
@json_option
@app_option
@click.option("--file", "files", multiple=True, type=click.Path(path_type=Path),
              help="An exported history (shardq history export) or a directory of them "
                   "(*.json); repeatable. Without it, runs are read from the shards.")
@click.option("--workflow", "workflows", multiple=True, help="Only runs of this workflow "
              "(repeatable).")
@click.option("--state", "states", multiple=True, type=click.Choice([s.value for s in State]),
              help="Only runs in this state (repeatable).")
@click.option("--since", callback=check_moment, help="Only runs created at or after this time.")
@click.option("--until", callback=check_moment, help="Only runs created before this time.")
@click.option("--tenant", help="Only runs of this tenant (default: every tenant).")
@click.option("--build", "builds", multiple=True, callback=_builds,
              help="Only runs started on this build (repeatable; runs on the shards only): "
                   "the check before `workflow migrate-build`.")
@click.option("--limit", type=click.IntRange(min=1), help="Replay at most this many runs.")
@click.option("--show", type=click.IntRange(min=0), default=20, show_default=True,
              help="Divergent runs printed in full (all are counted).")
@pass_settings
def replay(
    settings: Settings, app: str | None, files: tuple[Path, ...], workflows: tuple[str, ...],
    states: tuple[str, ...], since: datetime | None, until: datetime | None,
    tenant: str | None, builds: tuple[str, ...], limit: int | None, show: int,
) -> None:
    """Replay recorded histories against the code in --app, writing nothing; exit 10 when
    any run's history no longer replays (for CI: docs/versioning.md)."""
    import time

    from shardq.client.recorded import recorded_runs

    with errors_as_exit_codes():
        registry = load_registry(app)
    wanted = {State(s) for s in states}
    started = time.monotonic()
    if files and builds:
        fail("--build selects runs on the shards: an exported history records no build",
             EXIT_USAGE)
    if files:
        runs = _filtered(_read_files(files), set(workflows), wanted, since, until, tenant)
        summary = _summary(_checked(registry, runs, limit), show, started)
    else:
        with app_client(settings, app) as client, errors_as_exit_codes():
            runs = recorded_runs(client, workflows=workflows, states=sorted(wanted),
                                 since=since, until=until, tenant=tenant, builds=builds,
                                 limit=limit)
            summary = _summary(_checked(registry, runs, None), show, started)
    diverged = summary["diverged"]
    lines = [f"DIVERGED {d['execution_id']} {d['workflow']} {d['workflow_id']!r} "
             f"({d['state']}): {d['reason']}" for d in summary["divergent"]]
    if diverged > len(summary["divergent"]):
        lines.append(f"... and {diverged - len(summary['divergent'])} more (--show)")
    lines.append(f"replayed {summary['runs']} run(s): {summary['passed']} passed, "
                 f"{diverged} diverged ({summary['runs_per_s']:.0f} runs/s)")
    emit(settings, summary, "\n".join(lines))
    if diverged:
        raise SystemExit(EXIT_DIVERGED)


def _checked(registry: Any, runs: Iterable[RecordedRun], limit: int | None) -> Iterator[Verdict]:
    from shardq.workflow.replayer import check_run

    for count, run in enumerate(runs):
        if limit is not None and count >= limit:
            return
        yield check_run(registry, run)


def _summary(verdicts: Iterable[Verdict], show: int, started: float) -> dict[str, Any]:
    """The verdicts counted (`started`: the monotonic time the command began reading)."""
    import time

    runs = passed = 0
    divergent: list[dict[str, Any]] = []
    for verdict in verdicts:
        runs += 1
        if verdict.ok:
            passed += 1
        elif len(divergent) < show:
            run = verdict.run
            divergent.append({
                "execution_id": str(run.execution_id), "workflow": run.workflow_name,
                "workflow_version": run.workflow_version, "workflow_id": run.workflow_id,
                "state": run.state, "reason": verdict.reason, "position": verdict.position,
                "recorded": verdict.recorded, "called": verdict.called})
    seconds = time.monotonic() - started
    return {"runs": runs, "passed": passed, "diverged": runs - passed, "divergent": divergent,
            "seconds": round(seconds, 3), "runs_per_s": runs / seconds if seconds > 0 else 0.0}


def _read_files(paths: Iterable[Path]) -> Iterator[RecordedRun]:
    """Each file's run, a directory's *.json files in name order; a file that is no
    exported history stops the command (exit 2) naming it, before any verdict."""
    from shardq.workflow.exported import ExportError, loads

    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.glob("*.json"))
        else:
            found.append(path)
    runs = []
    for path in found:
        try:
            runs.append(loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"{path}: cannot read it: {exc}", EXIT_USAGE)
        except ExportError as exc:
            fail(f"{path}: not an exported history: {exc}", EXIT_USAGE)
    return iter(runs)


def _filtered(runs: Iterable[RecordedRun], workflows: set[str], states: set[State],
              since: datetime | None, until: datetime | None,
              tenant: str | None) -> Iterator[RecordedRun]:
    for run in runs:
        created = run.created_at
        if ((not workflows or run.workflow_name in workflows)
                and (not states or run.state in states)
                and (tenant is None or run.tenant == tenant)
                and (since is None or (created is not None and created >= since))
                and (until is None or (created is not None and created < until))):
            yield run


@click.group("history")
def history() -> None:
    """A run's recorded history, for replay checks and tests."""


@history.command("export")
@tenant_option
@execution_id_argument
@click.option("--out", "-o", type=click.Path(path_type=Path, dir_okay=False),
              help="Write it to this file (default: stdout).")
@pass_settings
def history_export(settings: Settings, tenant: str, execution_id: uuid.UUID,
                   out: Path | None) -> None:
    """Write a run's history as a JSON document `shardq replay --file` reads."""
    from shardq.workflow.exported import RecordedRun, dumps

    with open_client(settings) as client, errors_as_exit_codes():
        execution = client.get(execution_id, tenant=tenant)
        events = client.history(execution.id, tenant=tenant)
    text = dumps(RecordedRun.of(execution, tuple(events)))
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"{out}: cannot write it: {exc}", EXIT_USAGE)
    click.echo(f"wrote {out} ({len(events)} events)", err=True)


COMMANDS = [replay, history]

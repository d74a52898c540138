"""`shardq workflow builds | set-build | clear-build | migrate-build`: which build of
the code a workflow's runs start on and stay on (docs/versioning.md, "Builds")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from shardq.bin.cli.common import (
    EXIT_PARTIAL,
    Settings,
    by_rule,
    emit,
    errors_as_exit_codes,
    fail,
    json_option,
    open_client,
    pass_settings,
)
from shardq.core import rules
from shardq.core.builds import MIGRATION_WAIT_S, POLICIES, check_build_id

if TYPE_CHECKING:
    from shardq.core.builds import WorkflowBuild

workflow_argument = click.argument(
    "workflow", callback=by_rule(lambda value: rules.check_name(value, "workflow")))
build_rule = by_rule(check_build_id)


def _payload(found: WorkflowBuild) -> dict[str, Any]:
    return {"workflow": found.workflow, "build_id": found.build_id, "policy": found.policy,
            "pinned_runs": dict(found.runs), "differing": dict(found.differing)}


def _text(found: WorkflowBuild) -> str:
    if found.differing:
        current = "differs between shards: " + ", ".join(
            f"{shard} {held}" for shard, held in found.differing.items()) + " (set it again)"
    elif found.build_id is None:
        current = "no current build"
    else:
        current = f"build {found.build_id} ({found.policy})"
    runs = ", ".join(f"{n} on {build}" for build, n in found.runs.items())
    return f"{found.workflow}  {current}" + (f"; unfinished pinned runs: {runs}" if runs else "")


@click.command("builds")
@json_option
@pass_settings
def workflow_builds(settings: Settings) -> None:
    """Each workflow with a current build or runs pinned to one: its build and policy,
    and its unfinished pinned runs per build (reads every pinned run the shards keep)."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.workflow_builds()
    emit(settings, {"workflows": [_payload(b) for b in found]},
         "\n".join(_text(b) for b in found) or "no workflow has a build")


@click.command("set-build")
@json_option
@workflow_argument
@click.argument("build", callback=build_rule)
@click.option("--policy", type=click.Choice(POLICIES), default="pinned", show_default=True,
              help="pinned: a run stays on this build until migrate-build moves it; any: "
                   "it records the build and any worker runs it.")
@pass_settings
def workflow_set_build(settings: Settings, workflow: str, build: str, policy: str) -> None:
    """Make BUILD the current build of WORKFLOW on every shard: runs started from now on
    record it (and, pinned, run only on workers started with --build-id BUILD). Runs
    already started keep theirs."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.set_workflow_build(workflow, build, policy=policy)
    emit(settings, _payload(found), _text(found))


@click.command("clear-build")
@json_option
@workflow_argument
@pass_settings
def workflow_clear_build(settings: Settings, workflow: str) -> None:
    """Take back WORKFLOW's current build on every shard: new runs record none and any
    worker runs them. Runs already pinned stay pinned (see migrate-build)."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.set_workflow_build(workflow, None)
    emit(settings, _payload(found), _text(found))


@click.command("migrate-build")
@json_option
@workflow_argument
@click.option("--from", "from_build", required=True, callback=build_rule,
              help="The build the runs are pinned to now.")
@click.option("--to", "to_build", callback=lambda c, p, v: None if v is None else build_rule(
    c, p, v), help="The build to pin them to.")
@click.option("--unpin", is_flag=True, help="Pin them to no build: any worker runs them.")
@pass_settings
def workflow_migrate_build(settings: Settings, workflow: str, from_build: str,
                           to_build: str | None, unpin: bool) -> None:
    """Move every unfinished run of WORKFLOW pinned to --from to --to (or --unpin), on
    every shard. Check them first: `shardq replay --app NEW --workflow WORKFLOW --build
    FROM`. Exit 8 when a transaction older than the move was still open on some shard
    after the wait (core/builds.py, MIGRATION_WAIT_S): a task row may still carry the
    old build; run it again."""
    if unpin == (to_build is not None):
        fail("give exactly one of --to BUILD and --unpin", 2)
    with open_client(settings) as client, errors_as_exit_codes():
        done = client.migrate_build(workflow, from_build, to_build)
    target = f"build {to_build}" if to_build else "no build"
    emit(settings, {"workflow": workflow, "from": from_build, "to": to_build,
                    "moved": done.moved, "settled": done.settled},
         f"{done.moved} unfinished run(s) of {workflow} moved from build {from_build} to "
         f"{target}")
    if not done.settled:
        fail(f"a transaction older than the move was still open on a shard after "
             f"{MIGRATION_WAIT_S:.0f} s: run migrate-build again once it ends, to move the "
             "task rows it may have written", EXIT_PARTIAL)


WORKFLOW_COMMANDS = [workflow_builds, workflow_set_build, workflow_clear_build,
                     workflow_migrate_build]
"""What this module adds to the `shardq workflow` group (bin/cli/main.py)."""

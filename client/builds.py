"""Client calls for builds (docs/versioning.md, "Builds"): a workflow's current build
and policy, written to every shard, the runs pinned to each build, and migrate-build.
Operators' calls, on the sync client only. A part of `Client`, kept apart as flow.py is."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardq.client.flow import raise_unwritten
from shardq.core.builds import (
    MAX_MIGRATION_WAIT_S,
    MIGRATION_WAIT_S,
    WorkflowBuild,
    check_build_id,
    check_policy,
)
from shardq.core.errors import InvalidArgument
from shardq.core.rules import check_name
from shardq.shards.fanout import each_shard

if TYPE_CHECKING:
    from shardq.shards.config import ShardMap
    from shardq.store.store import Store



@dataclass(frozen=True)
class BuildMigration:
    """What migrate-build did: the runs it moved, and whether every shard's task rows
    were checked after the transactions that could have read an old build (False:
    run it again; it moves what is left, and nothing twice)."""

    moved: int
    settled: bool


class BuildCalls:
    """Client's build methods; Client provides `store` and `map`."""

    store: Store

    @property
    def map(self) -> ShardMap:
        raise NotImplementedError

    def set_workflow_build(self, workflow: str, build: str | None, *,
                           policy: str = "pinned") -> WorkflowBuild:
        """Make `build` the current build of `workflow` on every shard: runs started from
        now on record it and, with policy `pinned`, are claimed only by workers of that
        build until migrate_build moves them; with `any`, by every worker. None: no
        current build (new runs record none). Runs already started keep theirs. A shard
        that cannot be reached raises ShardUnavailable after the others are written."""
        checked = check_name(workflow, "workflow")
        chosen = None if build is None else check_build_id(build)
        pinned = check_policy(policy)
        reached = each_shard(self.map.shards, lambda s: self.store.set_workflow_build(
            s, checked, chosen, pinned))
        raise_unwritten(reached, f"the build of workflow {checked}")
        found = self.workflow_builds(checked)
        return found[0] if found else WorkflowBuild(checked, None, False)

    def workflow_builds(self, workflow: str | None = None) -> list[WorkflowBuild]:
        """Each workflow (or only `workflow`) that has a current build or runs pinned to
        one: its build and policy as the shards hold them, and its unfinished pinned
        runs per build (ShardUnavailable when a shard cannot be read)."""
        only = None if workflow is None else check_name(workflow, "workflow")
        current = each_shard(self.map.shards, self.store.workflow_builds)
        raise_unwritten(current, "")
        pinned = each_shard(self.map.shards, lambda s: self.store.pinned_runs(s, only))
        raise_unwritten(pinned, "")
        runs: dict[str, dict[str, int]] = defaultdict(dict)
        for counts in pinned.answers.values():
            for (name, build), n in counts.items():
                runs[name][build] = runs[name].get(build, 0) + n
        names = {w for held in current.answers.values() for w in held} | set(runs)
        if only is not None:
            names &= {only}
        found = []
        for name in sorted(names):
            seen = {s.name: held.get(name) for s, held in current.answers.items()}
            distinct = set(seen.values())
            agreed = next(iter(distinct)) if len(distinct) == 1 else None
            found.append(WorkflowBuild(
                name, agreed[0] if agreed else None, agreed[1] if agreed else False,
                runs=dict(sorted(runs[name].items())),
                differing={} if len(distinct) == 1 else {
                    shard: "none" if held is None else
                    f"{held[0]} ({'pinned' if held[1] else 'any'})"
                    for shard, held in sorted(seen.items())}))
        return found

    def migrate_build(self, workflow: str, from_build: str, to_build: str | None, *,
                      wait_s: float = MIGRATION_WAIT_S) -> BuildMigration:
        """Move every unfinished run of `workflow` pinned to `from_build` to `to_build`
        (None: pinned to no build, any worker claims it), on every shard. Check the
        runs with `shardq replay --build FROM` against the new code first: a run moved to
        code its history does not fit fails with NonDeterminismError. A shard that cannot
        be reached raises ShardUnavailable after the others are done."""
        checked = check_name(workflow, "workflow")
        source = check_build_id(from_build)
        target = None if to_build is None else check_build_id(to_build)
        if source == target:
            raise InvalidArgument(f"the runs are on build {source} already: give another "
                                  "build to move them to")
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not (
                0 <= wait_s <= MAX_MIGRATION_WAIT_S):
            raise InvalidArgument(f"wait_s must be 0..{MAX_MIGRATION_WAIT_S:.0f} seconds, got "
                                  f"{wait_s!r}")
        reached = each_shard(self.map.shards, lambda s: self.store.migrate_build(
            s, checked, source, target, wait_s=wait_s))
        raise_unwritten(reached, f"the move of workflow {checked}'s runs off build {source}")
        return BuildMigration(sum(moved for moved, _ in reached.answers.values()),
                              all(settled for _, settled in reached.answers.values()))

"""Builds (docs/versioning.md, "Builds"): which build of the code a worker runs, and
which build a workflow's runs start on and are held to (schema/0026)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from shardq.core.errors import InvalidArgument

BUILD_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,127}"
"""A letter, digit or underscore, then those and `. : + -`; at most 128 characters: a
git commit, a version (`2.4.1+b7`), a date."""

_BUILD = re.compile(BUILD_PATTERN)

MIGRATION_WAIT_S = 30.0
"""How long migrate-build waits, per shard, for transactions older than its first step."""
MAX_MIGRATION_WAIT_S = 3600.0

POLICIES = ("pinned", "any")
"""`pinned`: a run stays on the build current at its start until an operator moves it;
`any`: it records that build and any worker runs it."""


def check_build_id(value: object) -> str:
    """Return `value` if it is a valid build id, else raise InvalidArgument saying why."""
    if not isinstance(value, str) or not _BUILD.fullmatch(value):
        raise InvalidArgument(
            f"a build id must be letters, digits and _ . : + - (not starting with one of "
            f". : + -), at most 128 characters, got {value!r}")
    return value


def check_policy(value: object) -> bool:
    """True for `pinned`, False for `any`; InvalidArgument for anything else."""
    if value not in POLICIES:
        raise InvalidArgument(f"a build policy is one of {', '.join(POLICIES)}, got {value!r}")
    return value == "pinned"


@dataclass(frozen=True)
class WorkflowBuild:
    """A workflow's current build as the shards hold it, and its runs pinned to builds."""

    workflow: str
    build_id: str | None
    """The build new runs record (None: no build set, or the shards differ)."""
    pinned: bool
    """New runs are held to `build_id`."""
    runs: Mapping[str, int] = field(default_factory=dict)
    """Unfinished runs pinned to each build, over every shard."""
    differing: Mapping[str, str] = field(default_factory=dict)
    """Shard -> what it holds, when the shards do not agree (set it again)."""

    @property
    def policy(self) -> str:
        return "pinned" if self.pinned else "any"

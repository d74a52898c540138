"""Errors raised by the shard layer: configuration, reachability, migrations.

Every message names the shard (by name and redacted URL) and the cause, so the
CLI can print it as one line instead of a traceback.
"""

from __future__ import annotations

import json


class ShardqError(Exception):
    """Base class of every error shardq raises on purpose."""


class ConfigError(ShardqError):
    """The shard map or a setting is malformed (bad URL, duplicate, gap in the buckets)."""


class ShardUnavailable(ShardqError):
    """A shard could not be reached or refused the connection (host down, bad password, no db)."""


class ShardRetired(ShardUnavailable):
    """A shard the current map version dropped (`shards remove`): not an outage. Daemons
    stop serving it, quietly; a caller holding one of its runs' ids follows the map."""


class MapMismatch(ShardqError):
    """A shard was migrated with another shard map than the one this process holds."""


class SchemaBehind(ShardqError):
    """A shard lacks migrations this code needs: run `shardq migrate`."""


class MigrationError(ShardqError):
    """A migration file failed; nothing of that file was applied."""


class MoveRunning(ShardqError):
    """The map is being changed: another move or `shards add|remove` holds the mover's
    lock, or a move is unfinished (resume or abort it first)."""


class NotOwner(ShardqError):
    """A shard refused a write (or a read) of a bucket it does not own: the bucket moved.

    The caller's map is older than `map_version`, which the refusing shard holds
    in its `shardq.shard_maps`: read it there and send the request to the owner it
    names. Callers inside shardq do that themselves; this reaches a user only when
    following the map did not settle within the retry budget.
    """

    def __init__(self, message: str, *, shard: str, bucket: int, map_version: int) -> None:
        super().__init__(message)
        self.shard = shard
        self.bucket = bucket
        self.map_version = map_version


class Fenced(NotOwner):
    """A shard refused a write to a bucket a move has frozen while it copies it away.

    The pause lasts one batch of the move (well under a second, as a rule): retry.
    `move` and `target` name the move and the shard the bucket is going to.
    """

    def __init__(self, message: str, *, shard: str, bucket: int, map_version: int,
                 move: int | None, target: str | None) -> None:
        super().__init__(message, shard=shard, bucket=bucket, map_version=map_version)
        self.move = move
        self.target = target


FENCED_SQLSTATE = "SQ001"
NOT_OWNER_SQLSTATE = "SQ002"
"""What shardq.fence() raises (schema/functions/fence.sql)."""


def refusal(shard: str, sqlstate: str | None, message: str, detail: str | None) -> (
    NotOwner | None
):
    """The NotOwner or Fenced a database error stands for, or None when it is another error."""
    if sqlstate not in (FENCED_SQLSTATE, NOT_OWNER_SQLSTATE):
        return None
    try:
        fields = json.loads(detail or "{}")
    except ValueError:
        fields = {}
    text = f"{shard}: {message}"
    bucket, version = int(fields.get("bucket", -1)), int(fields.get("map_version", 0))
    if sqlstate == FENCED_SQLSTATE:
        return Fenced(text, shard=shard, bucket=bucket, map_version=version,
                      move=fields.get("move"), target=fields.get("target"))
    return NotOwner(text, shard=shard, bucket=bucket, map_version=version)

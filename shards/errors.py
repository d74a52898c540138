"""Errors raised by the shard layer: configuration, reachability, migrations.

Every message names the shard (by name and redacted URL) and the cause, so the
CLI can print it as one line instead of a traceback.
"""

from __future__ import annotations


class ShardqError(Exception):
    """Base class of every error shardq raises on purpose."""


class ConfigError(ShardqError):
    """The shard map or a setting is malformed (bad URL, duplicate, gap in the buckets)."""


class ShardUnavailable(ShardqError):
    """A shard could not be reached or refused the connection (host down, bad password, no db)."""


class MapMismatch(ShardqError):
    """A shard was migrated with another shard map than the one this process holds."""


class SchemaBehind(ShardqError):
    """A shard lacks migrations this code needs: run `shardq migrate`."""


class MigrationError(ShardqError):
    """A migration file failed; nothing of that file was applied."""

"""Keys to buckets, buckets into execution ids.

A workflow key (tenant, workflow name, workflow_id) hashes into a fixed space of
BUCKETS virtual buckets; the shard map assigns contiguous bucket ranges to shards.
The execution id carries its bucket, so any process routes an id to its shard
with no lookup and no central directory.

Execution ids are RFC 9562 version-8 UUIDs laid out like UUIDv7 (48-bit Unix
milliseconds first, so ids created together sit together in a B-tree) with the
12 bits where v7 keeps `rand_a` holding the bucket:

    | unix_ts_ms (48) | ver=8 (4) | bucket (12) | var=0b10 (2) | random (62) |
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid

from shardq.shards.errors import ShardqError

BUCKETS = 4096
"""Size of the virtual bucket space. Fixed forever: it is baked into every execution id."""

_BUCKET_BITS = 12
_VERSION = 8
assert 1 << _BUCKET_BITS == BUCKETS


class InvalidExecutionId(ShardqError, ValueError):
    """The value is not a shardq execution id (wrong shape or not a version-8 UUID)."""


def bucket_for(tenant: str, workflow_name: str, workflow_id: str) -> int:
    """Stable bucket of a workflow key: the same in every process, run and Python version.

    Python's built-in hash() is salted per process, so a cryptographic digest of an
    unambiguous encoding (length-prefixed parts) is used instead.
    """
    return _bucket_of(tenant, workflow_name, workflow_id)


def bucket_for_key(concurrency_key: str) -> int:
    """The bucket of every run of a concurrency key (docs/flow-control.md): all of them,
    the key's limit row and its queue live on one shard, whatever their tenant or
    workflow."""
    return _bucket_of("concurrency", concurrency_key)


def _bucket_of(*parts: str) -> int:
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        encoded = part.encode("utf-8")
        digest.update(len(encoded).to_bytes(4, "big"))
        digest.update(encoded)
    return int.from_bytes(digest.digest(), "big") % BUCKETS


def new_execution_id(bucket: int, *, now_ms: int | None = None) -> uuid.UUID:
    """A fresh, time-ordered execution id that routes to `bucket`."""
    if not 0 <= bucket < BUCKETS:
        raise ValueError(f"bucket {bucket} is outside 0..{BUCKETS - 1}")
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (
        (ms & ((1 << 48) - 1)) << 80
        | _VERSION << 76
        | bucket << 64
        | 0b10 << 62
        | rand
    )
    return uuid.UUID(int=value)


def parse_execution_id(value: str | uuid.UUID) -> uuid.UUID:
    """Validate a user-supplied execution id; raises InvalidExecutionId naming the value."""
    if isinstance(value, uuid.UUID):
        parsed = value
    else:
        try:
            parsed = uuid.UUID(value)
        except (ValueError, AttributeError, TypeError):
            message = f"{value!r} is not an execution id (expected a UUID)"
            raise InvalidExecutionId(message) from None
    if parsed.version != _VERSION or parsed.variant != uuid.RFC_4122:
        raise InvalidExecutionId(f"{value} is not a shardq execution id (not a version-8 UUID)")
    return parsed


def bucket_of(execution_id: str | uuid.UUID) -> int:
    """The bucket an execution id was minted for."""
    return (parse_execution_id(execution_id).int >> 64) & (BUCKETS - 1)

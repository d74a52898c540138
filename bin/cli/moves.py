"""`shardq shards move` and `shardq shards rebalance`: moving bucket ranges between shards.

Registered into the `shards` group (bin/cli/shards.py) by `register`.
"""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add the move commands to the `shards` group."""

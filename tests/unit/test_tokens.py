"""Lease tokens minted by this process: unique, and not shared with a forked child."""

from __future__ import annotations

import os

from shardq.core.models import TurnCommit, fresh_token


def test_tokens_are_unique_and_every_commit_gets_its_own() -> None:
    tokens = {fresh_token() for _ in range(100_000)}
    assert len(tokens) == 100_000
    run, lease = fresh_token(), fresh_token()
    commits = [TurnCommit(run, lease) for _ in range(3)]
    assert len({c.next_token for c in commits}) == 3
    assert not tokens & {c.next_token for c in commits}


def test_a_forked_child_mints_tokens_of_its_own() -> None:
    """A child that kept its parent's prefix and counter would repeat its parent's next
    tokens: two commits could then carry the same fencing token."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next token and leave at once
        os.write(write, fresh_token().bytes)
        os._exit(0)
    os.close(write)
    child = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    parent = fresh_token()
    assert len(child) == 16
    assert child[:8] != parent.bytes[:8]

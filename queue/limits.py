"""Bounds on what a caller may store: `Limits`, defined with every input rule in
queue/rules.py and kept importable here."""

from shardq.queue.rules import Limits

__all__ = ["Limits"]

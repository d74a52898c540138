"""Names of workflows, steps, timers and signals: one documented character set.

The rules live in queue/rules.py (every input rule, in one module); this module
keeps the names its importers use.
"""

from shardq.queue.rules import (
    NAME_PATTERN,
    RESERVED_PREFIXES,
    check_name,
    check_signal_name,
    check_text,
)

__all__ = ["NAME_PATTERN", "RESERVED_PREFIXES", "check_name", "check_signal_name", "check_text"]

"""JSON Schema (Draft 2020-12) at the boundary: a bad payload is refused before it is stored.

Defined in queue/rules.py (every input rule, in one module); kept importable here.
"""

from shardq.queue.rules import MAX_VIOLATIONS, check_schema, pointer, validate

__all__ = ["MAX_VIOLATIONS", "check_schema", "pointer", "validate"]

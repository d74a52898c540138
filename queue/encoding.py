"""Values as the database will store them: JSON text, or a clear reason why not.

Defined in queue/rules.py (every input rule, in one module); kept importable here.
"""

from shardq.queue.rules import to_json

__all__ = ["to_json"]

"""The run a thread is working on, added to every log record made meanwhile.

A turn thread sets it for the length of a turn, so every line logged about
that run (by the journal, the turn, the context, a step's own logging) carries
`execution_id`, `shard` and `workflow` without each call site repeating them.
The daemons' log setup (bin/logs.py) installs RunContextFilter.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_RUN: ContextVar[dict[str, str] | None] = ContextVar("shardq_run", default=None)


@contextmanager
def about_run(execution_id: object, shard: str, workflow: str) -> Iterator[None]:
    token = _RUN.set({"execution_id": str(execution_id), "shard": shard, "workflow": workflow})
    try:
        yield
    finally:
        _RUN.reset(token)


class RunContextFilter(logging.Filter):
    """Adds the current run's fields to a record that does not carry them already."""

    def filter(self, record: logging.LogRecord) -> bool:
        run = _RUN.get()
        if run is not None:
            for key, value in run.items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        return True

"""Log setup for the daemons: one line per record (logfmt or JSON), extras included, quiet
by default."""

from __future__ import annotations

import json
import logging
import sys

from shardq.core.tracing import TraceIds
from shardq.worker.logcontext import RunContextFilter

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    """`ts=... level=... logger=... msg="..." key=value ...` so logs grep and parse alike."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        line = " ".join(f"{k}={_quote(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line, the same fields as the logfmt lines."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return json.dumps(fields, default=str)


FORMATS = {"logfmt": KeyValueFormatter, "json": JsonFormatter}


def _quote(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def configure(verbosity: int, log_format: str = "logfmt") -> None:
    """WARNING by default, INFO with -v, DEBUG with -vv; psycopg's pool stays at WARNING."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbosity, 2)]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FORMATS[log_format]())
    handler.addFilter(RunContextFilter())
    handler.addFilter(TraceIds())  # trace_id and span_id inside a recording span
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("psycopg").setLevel(max(level, logging.WARNING))

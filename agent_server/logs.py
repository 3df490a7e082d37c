"""Logs as one JSON object a line, every record passed through the redactor (SPEC 8)."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime

from agent_server.redaction import RedactingFilter, Redactor

execution_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "execution_id", default=None
)
"""The turn the current task serves: stamped on every log line written under it."""

_EXTRA_FIELDS = ("key", "execution_id")


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as compact JSON: time, level, logger, message, execution id."""
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        execution_id = getattr(record, "execution_id", None) or execution_id_var.get()
        if execution_id:
            entry["execution_id"] = execution_id
        for name in _EXTRA_FIELDS:
            if name != "execution_id" and hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        # default=str: an odd `extra` value must not turn the line into a traceback.
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(redactor: Redactor, level: int = logging.INFO) -> logging.Handler:
    """Send the root, uvicorn and access logs through one redacting JSON handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter(redactor))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "agent_server", False):
            root.removeHandler(old)
    handler.agent_server = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        # Whatever an earlier uvicorn config set (own handlers, levels), follow the root.
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
        logger.disabled = False
        logger.propagate = True
    # A Python warning would otherwise reach stderr as a bare text line.
    logging.captureWarnings(True)
    return handler

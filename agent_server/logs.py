"""Logs on stderr, every record passed through the redactor first (contract §8).

Two formats of the same fields: JSON, one object a line, for containers and log
shippers; text, one short line a record, for a person at a terminal.
`choose_log_format` picks one: the operator's `AGENT_SERVER_LOG_FORMAT`, else text
on a terminal and JSON anywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import TextIO

from agent_server.redaction.redactor import LOG_EXTRA_FIELDS, RedactingFilter, Redactor

execution_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "execution_id", default=None
)
"""The turn the current task serves: stamped on every log line written under it."""

LOG_FORMATS = ("json", "text")


def choose_log_format(configured: str | None, *, isatty: bool) -> str:
    """`json` or `text`: the configured format, else text on a terminal, JSON elsewhere.

    Raises ValueError for a configured value that is neither.
    """
    if configured is None or not configured.strip():
        return "text" if isatty else "json"
    chosen = configured.strip().lower()
    if chosen not in LOG_FORMATS:
        msg = f"{configured!r} is not a log format (use json or text)"
        raise ValueError(msg)
    return chosen


_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}
"""Every control character and line break, written as its escape in a text log."""
_LINE_CONTROLS = {code: text for code, text in _CONTROLS.items() if code != ord("\n")}
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_LOGGED_NAME = 64


def escape_controls(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control character and line break escaped (`\\x1b`, `\\u2028`):
    a line of a text log stays one line, and no escape sequence reaches a terminal."""
    return text.translate(_LINE_CONTROLS if keep_newlines else _CONTROLS)


def logged_name(name: str) -> str:
    """A name the agent chose (a `.env` key), as a log may hold it: itself when it is a
    plain identifier, else its `repr` clipped to `MAX_LOGGED_NAME` characters and escaped."""
    if _PLAIN_NAME.fullmatch(name):
        return name
    return escape_controls(ascii(name[:MAX_LOGGED_NAME]))


def _context(record: logging.LogRecord) -> dict[str, object]:
    """The turn and key a record is about, when it is about one."""
    fields: dict[str, object] = {}
    execution_id = getattr(record, "execution_id", None) or execution_id_var.get()
    if execution_id:
        fields["execution_id"] = execution_id
    for name in LOG_EXTRA_FIELDS:
        if name != "execution_id" and hasattr(record, name):
            fields[name] = getattr(record, name)
    return fields


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
        entry.update(_context(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        # default=str: an odd `extra` value must not turn the line into a traceback.
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """Formats a record as one short line: `12:00:01 WARNING logger: message [k=v]`."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a line a person reads; a traceback follows on its own lines."""
        stamp = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        context = " ".join(f"{k}={v}" for k, v in _context(record).items())
        line = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if context:
            line += f" [{context}]"
        line = escape_controls(line)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:  # its own lines, each escaped
            line += "\n" + escape_controls(record.exc_text, keep_newlines=True)
        return line


class LoopDeferredHandler(logging.StreamHandler[TextIO]):
    """A stream handler that, on a thread running an event loop, writes at its next step.

    A record logged on the loop (a turn's `turn finished`, uvicorn's access line) is
    queued with its message rendered and its turn stamped, and filtered, formatted
    and written in a callback the loop runs next: after the answer the code logging
    it is about to send. Elsewhere (boot, worker threads) a record is written at
    once, after whatever is queued. `flush()` writes the queue too.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._queue: list[logging.LogRecord] = []

    def handle(self, record: logging.LogRecord) -> bool:
        """Queue `record` on a loop's thread; otherwise handle the queue, then it."""
        loop = asyncio._get_running_loop()
        if loop is None:
            self.write_queued()
            return bool(super().handle(record))
        # What formatting reads later is taken now (as QueueHandler.prepare does).
        # A message that cannot be rendered is left for the write to report, as usual.
        with contextlib.suppress(Exception):
            record.msg, record.args = record.getMessage(), None
        if getattr(record, "execution_id", None) is None:
            record.execution_id = execution_id_var.get()
        with self.lock:  # type: ignore[union-attr]
            self._queue.append(record)
            first = len(self._queue) == 1
        if first:
            # An empty context: a record stamped with no turn stays so.
            loop.call_soon(self.write_queued, context=contextvars.Context())
        return True

    def write_queued(self) -> None:
        """Filter, format and write every queued record, in order."""
        with self.lock:  # type: ignore[union-attr]
            queued, self._queue = self._queue, []
        for record in queued:
            super().handle(record)

    def flush(self) -> None:
        """Write the queue, then flush the stream."""
        self.write_queued()
        super().flush()


def lean_records() -> None:
    """Stop records collecting what no formatter here writes: the caller's file and
    line (a stack walk per record), thread, process and multiprocessing names.

    For the server process (`serve`): the logging HOWTO's own optimisation flags,
    global to the process, so never set by `configure_logging` (tests call it).
    """
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def configure_logging(
    redactor: Redactor, level: int = logging.INFO, log_format: str = "json"
) -> logging.Handler:
    """Send the root, uvicorn and access logs through one redacting handler.

    `log_format` is `json` or `text` (see `choose_log_format`). Calling it again
    replaces the handler an earlier call installed.
    """
    handler = LoopDeferredHandler(sys.stderr)
    handler.setFormatter(TextFormatter() if log_format == "text" else JsonFormatter())
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

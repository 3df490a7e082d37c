"""Reading one line of any runtime's event stream, safely and with bounded memory.

Shared by the Claude Code, Codex and Gemini CLI parsers: a line is a JSON object or
nothing, a field has the type it should or is None, and error texts are capped.
"""

from __future__ import annotations

import json
from typing import Any

from agent_server.runtimes.stream import TurnStream

# One error text is enough to classify and to show; a runaway one must not grow memory.
MAX_ERROR_TEXT_CHARS = 4096
MAX_ERROR_TEXTS = 32


def decode_event(line: bytes) -> dict[str, Any] | None:
    """One stdout line as a JSON object, or None for anything else (never raises)."""
    stripped = line.strip()
    if not stripped.startswith(b"{"):
        return None
    try:
        event = json.loads(stripped)
    except (ValueError, RecursionError):
        # ValueError covers invalid JSON and invalid UTF-8 (UnicodeDecodeError).
        return None
    return event if isinstance(event, dict) else None


def as_int(value: object) -> int | None:
    """An int field, refusing bools and non-integral numbers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def as_float(value: object) -> float | None:
    """A numeric field as float, refusing bools."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def as_str(value: object) -> str | None:
    """A non-empty string field, else None."""
    return value if isinstance(value, str) and value else None


def add_error_text(stream: TurnStream, text: str | None) -> None:
    """Append one error-channel text, bounded and without repeating the last one."""
    if not text or len(stream.error_texts) >= MAX_ERROR_TEXTS:
        return
    clipped = text[:MAX_ERROR_TEXT_CHARS]
    if clipped not in stream.error_texts:
        stream.error_texts.append(clipped)

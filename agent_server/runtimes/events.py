"""Reading one line of any runtime's event stream, safely and with bounded memory.

Shared by the Claude Code, Codex and Gemini CLI parsers and by the answer's
execution_log: a line is a well-formed JSON value or nothing, a field has the type
and shape it should or is None, and error texts are capped. Every string here comes
from the CLI, so every string is hostile: a line that is too deep, holds a
non-finite number or a lone surrogate is no event at all (the execution_log keeps
it as text), and an identifier that does not look like one is dropped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from typing import Any

from agent_server.runtimes.stream import TurnStream

# One error text is enough to classify and to show; a runaway one must not grow memory.
MAX_ERROR_TEXT_CHARS = 4096
MAX_ERROR_TEXTS = 32
MAX_EVENT_DEPTH = 32
"""A real event nests a handful of levels (a tool input a few more); deeper is not one."""

_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_MODEL_ID = re.compile(r"^[A-Za-z0-9<][A-Za-z0-9._:/@\[\]<>-]{0,127}$")
OTHER = "other"
"""What a field from a known set reads when the CLI said something else."""


def load_event(line: bytes | str) -> Any:
    """One line as a JSON value, or None: not UTF-8, invalid, too deep, non-finite, or
    holding a lone surrogate.

    Never raises. The checks are read off the text where it can tell (it usually
    can), else made by walking the value.
    """
    try:
        # Strict UTF-8: an encoded surrogate is refused here, so none comes from raw bytes.
        text = line.decode("utf-8") if isinstance(line, bytes) else line
        value = _DECODER.decode(text)  # a NaN, an Infinity or a 1e999 is refused here
    except (ValueError, RecursionError):  # invalid JSON or UTF-8; nested past the C stack
        return None
    if isinstance(line, bytes) and _plainly_sound(text):
        return value
    return value if _well_formed(value) else None


def _finite_float(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise ValueError(literal)
    return number


def _no_constant(literal: str) -> float:
    raise ValueError(literal)


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _plainly_sound(text: str) -> bool:
    """What `_well_formed` checks, read off a strictly decoded line when it can be: no
    more brackets than MAX_EVENT_DEPTH (so no deeper nesting), and no `\\u` escape of
    a surrogate (so no lone one). False means only that the walk must decide."""
    return (
        text.count("{") + text.count("[") <= MAX_EVENT_DEPTH
        and _SURROGATE_ESCAPE.search(text) is None
    )


def decode_event(line: bytes) -> dict[str, Any] | None:
    """One stdout line as a JSON object, or None for anything else (never raises)."""
    stripped = line.strip()
    if not stripped.startswith(b"{"):
        return None
    event = load_event(stripped)
    return event if isinstance(event, dict) else None


def _well_formed(value: Any, depth: int = 0) -> bool:
    """No deeper than MAX_EVENT_DEPTH, and every string encodable (no lone surrogate).
    Numbers need no look: `_DECODER` refused every one that is not finite.

    Recursive, and so bounded by MAX_EVENT_DEPTH: a line the text check cannot settle
    passes here.
    """
    if isinstance(value, str):
        return value.isascii() or _encodable(value)
    if isinstance(value, dict):
        if depth >= MAX_EVENT_DEPTH:
            return False
        depth += 1
        for key, item in value.items():
            if not (_well_formed(key, depth) and _well_formed(item, depth)):
                return False
        return True
    if isinstance(value, list):
        if depth >= MAX_EVENT_DEPTH:
            return False
        depth += 1
        for item in value:  # noqa: SIM110 - all() over a generator is slower, on every line
            if not _well_formed(item, depth):
                return False
        return True
    return True


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


def as_session_id(value: object) -> str | None:
    """A session id: a UUID-like token of at most 128 characters, else None."""
    return value if isinstance(value, str) and _SESSION_ID.fullmatch(value) else None


def as_model_id(value: object) -> str | None:
    """A model id such as `claude-sonnet-5-5` or `models/gemini-2.5-pro`, else None."""
    return value if isinstance(value, str) and _MODEL_ID.fullmatch(value) else None


def one_of(value: object, known: Collection[str]) -> str | None:
    """`value` when it is one of `known`, `other` for any other string, else None."""
    if not isinstance(value, str) or not value:
        return None
    return value if value in known else OTHER


def add_error_text(stream: TurnStream, text: str | None, *, first: bool = False) -> None:
    """Append one error-channel text, bounded and never twice; `first` puts it ahead of
    the others (the text a failure's message is made of)."""
    if not text:
        return
    clipped = text[:MAX_ERROR_TEXT_CHARS]
    texts = stream.error_texts
    if first:
        if clipped in texts:
            texts.remove(clipped)
        texts.insert(0, clipped)
        del texts[MAX_ERROR_TEXTS:]
    elif len(texts) < MAX_ERROR_TEXTS and clipped not in texts:
        texts.append(clipped)

"""When a rate-limited credential serves again, from the runtime's own facts.

The structured `rate_limit_info.resetsAt` (epoch seconds) is authoritative. Without
it, the reset is read from the error texts by the runtime's reset parsers
(`OutcomeHints.reset_parsers`, each adapter's wordings), the first that names one.

Texts are read only so far, a parser's failure is no reset, and an instant before
`now` is stale and gives None: the controller must never see an invented reset, and
never one before `now`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from agent_server.runtimes.base import ResetParser
from agent_server.runtimes.reset_clock import from_epoch_value

__all__ = ["parse_resets_at"]

# Texts are scanned only this far: error texts are short, and regexes stay cheap.
_MAX_TEXT_CHARS = 4096


def parse_resets_at(
    rate_limit_info: Mapping[str, Any] | None,
    texts: Sequence[str],
    now: datetime,
    parsers: Sequence[ResetParser],
) -> datetime | None:
    """The instant (aware, UTC) a rate limit resets, or None when it is not known.

    `rate_limit_info["resetsAt"]` wins; otherwise the first text one of `parsers`
    reads a reset in. Never raises, never returns an instant before `now`.
    """
    try:
        now_utc = _as_utc(now)
        if rate_limit_info is not None and "resetsAt" in rate_limit_info:
            structured = from_epoch_value(rate_limit_info.get("resetsAt"))
            if structured is not None:
                # A parseable structured reset is authoritative, even when stale:
                # rolling the text's clock time forward would invent a reset.
                return structured if structured >= now_utc else None
        for text in texts:
            if isinstance(text, str):
                found = _from_text(text[:_MAX_TEXT_CHARS], now_utc, parsers)
                if found is not None:
                    return found
    except (ArithmeticError, ValueError, TypeError, LookupError, OSError):
        # Defence in depth: a reset is a hint; a parser bug must not fail a turn.
        return None
    return None


def _as_utc(now: datetime) -> datetime:
    """`now` as an aware UTC datetime; a naive value is taken as UTC."""
    if now.tzinfo is None or now.utcoffset() is None:
        return now.replace(tzinfo=UTC)
    return now.astimezone(UTC)


def _from_text(text: str, now: datetime, parsers: Sequence[ResetParser]) -> datetime | None:
    """The first reset instant any of `parsers` reads in `text`, or None."""
    for parse in parsers:
        found = parse(text, now)
        if found is not None and found >= now:
            return found
    return None

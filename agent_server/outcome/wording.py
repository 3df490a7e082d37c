"""A failed turn's message: the CLI's own words, one line, scrubbed for the controller.

The controller reads a message as well as its status (contract §7 "Messages"): it
switches credentials on auth words and never on a model-rejection marker, whatever
the status. So a message keeps the words of its own outcome only. And it is the
CLI's line that names the failure: of an error text of many lines (a stderr with a
CLI's chatter around its error), the first line that says what the outcome is.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from agent_server.runtimes import MODEL_REJECTION_MARKERS as RUNTIME_REJECTION_MARKERS
from agent_server.runtimes.base import OutcomeHints
from agent_server.wire.names import OutcomeKind

# The words the controller scans a failed turn's message for (Trinity's
# failure_classifier): the auth words make it switch credentials (a billing message
# keeps "credit balance", which is how older controller paths recognise billing),
# and a model-rejection marker stops any switch, whatever the status. A message
# keeps only the words of its own outcome; every other one is scrubbed out.
AUTH_WORDS = (
    "401",
    "403",
    "oauth",
    "unauthorized",
    "authentication",
    "credentials",
    "forbidden",
    "token expired",
    "not authenticated",
)
BILLING_WORDS = ("credit balance",)
MODEL_REJECTION_MARKERS = (
    "model unsupported:",
    "does not support this model",
    *RUNTIME_REJECTION_MARKERS,
)
MODEL_REJECTION_PREFIX = "Model unsupported: "
"""Row 5's message starts with it: the marker the controller reads a rejection by."""
_KEPT = {
    OutcomeKind.AUTH: (*AUTH_WORDS, *BILLING_WORDS),
    OutcomeKind.BILLING: BILLING_WORDS,
    OutcomeKind.MODEL_UNSUPPORTED: MODEL_REJECTION_MARKERS,
}
_REPLACEMENTS = {
    "401": "4xx",
    "403": "4xx",
    "oauth": "login",
    "unauthorized": "denied",
    "authentication": "sign-in",
    "credentials": "login",
    "forbidden": "denied",
    "token expired": "session ended",
    "not authenticated": "not signed in",
    "credit balance": "account balance",
    "model unsupported:": "model unsupported -",
    "does not support this model": "cannot use this model",
    **RUNTIME_REJECTION_MARKERS,
}


@functools.cache
def _scrub_pattern(kind: OutcomeKind) -> re.Pattern[str]:
    """The controller words a message of `kind` must not hold."""
    kept = _KEPT.get(kind, ())
    banned = [word for word in _REPLACEMENTS if word not in kept]
    return re.compile("|".join(re.escape(word) for word in banned), re.IGNORECASE)


_MAX_MESSAGE_CHARS = 500


def shape_message(message: str, kind: OutcomeKind) -> str:
    """One short line, scrubbed of the controller's words that are not its outcome's.

    A message keeps the words of its own outcome only (auth, billing, model
    rejection) and loses the others'. Its input is already redacted (CLI output is
    masked as it arrives): clipping can only cut a mask, never a secret.
    """
    line = _clip(" ".join(message.split()))
    scrub = _scrub_pattern(kind)
    # A replacement holds no banned word, but one next to the text around it could
    # spell one anew: repeat until clean, a bounded number of times.
    for _ in range(len(line) + 1):
        if scrub.search(line) is None:
            return _clip(line)
        line = scrub.sub(lambda m: _REPLACEMENTS[m.group(0).lower()], line)
    return "The turn failed"


def _clip(line: str) -> str:
    if len(line) <= _MAX_MESSAGE_CHARS:
        return line
    return line[: _MAX_MESSAGE_CHARS - 1] + "…"


def telling_text(texts: Sequence[str], kind: OutcomeKind, hints: OutcomeHints) -> str | None:
    """The first non-blank text; of one of many lines, its first line that names `kind`
    (a runtime marker of `kind`, or a text marker of its row), else the whole text."""
    own = [marker for marker, marked in hints.error_markers if marked is kind]
    shared = [pattern for pattern, marked in hints.text_markers if marked is kind]
    for text in texts:
        if not text.strip():
            continue
        for line in text.splitlines():
            lowered = line.lower()
            if any(m in lowered for m in own) or any(p.search(line) for p in shared):
                return line
        return text
    return None

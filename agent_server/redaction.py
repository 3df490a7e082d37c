"""The redactor: no secret leaves the server in a log line or a response (contract §8).

It replaces the exact value of every credential it has been told about (grow-only:
a rotated-out token must stay hidden too) and token-shaped text (`sk-ant-…`, the
value after `Authorization: Bearer`). Values shorter than 8 characters are not
secrets worth a false positive on every short word.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

from pydantic import SecretStr

MASK = "[REDACTED]"
MIN_SECRET_LENGTH = 8
# The value after "Bearer" in an Authorization header however it is printed:
# `Authorization: Bearer v`, a dict repr `'authorization': 'Bearer v'`, `Authorization=Bearer v`,
# or URL-encoded in a logged request line (`Authorization%3A+Bearer+v`).
_GAP = r"(?:\s|\+|%20)"
_TOKEN_PATTERNS = re.compile(
    r"sk-ant-[A-Za-z0-9_\-]+"
    rf"|(?P<head>Authorization[\"']?{_GAP}*(?:[:=]|%3A|%3D){_GAP}*[\"']?Bearer{_GAP}+)"
    r"[^\s\"',;}&]+",
    re.IGNORECASE,
)


class Redactor:
    """Masks known secret values and token patterns in text and JSON-like values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def add(self, values: Iterable[SecretStr | str | None]) -> None:
        """Remember secret values to mask from now on."""
        new = set()
        for value in values:
            plain = value.get_secret_value() if isinstance(value, SecretStr) else value
            if plain and len(plain) >= MIN_SECRET_LENGTH and plain not in self._secrets:
                new.add(plain)
        if not new:
            return
        with self._lock:
            self._secrets |= new
            # Longest first, so a secret that contains another is masked whole.
            ordered = sorted(self._secrets, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(s) for s in ordered))

    def redact(self, text: str) -> str:
        """`text` with every known secret and token pattern masked."""
        pattern = self._pattern
        if pattern is not None:
            text = pattern.sub(MASK, text)
        return _TOKEN_PATTERNS.sub(_mask_token, text)

    def redact_value(self, value: Any) -> Any:
        """Redact every string inside a JSON-like value (dicts, lists, strings)."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact(str(k)): self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_value(v) for v in value]
        return value


def _mask_token(match: re.Match[str]) -> str:
    """Keep the `Authorization: Bearer ` prefix, mask what follows (or the whole `sk-ant-…`)."""
    return (match.group("head") or "") + MASK


class RedactingFilter(logging.Filter):
    """A handler filter that renders each record's message and masks it."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the record's message with its redacted rendering; never drops."""
        record.msg = self.redactor.redact(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.redact(record.exc_text)
        return True

"""The server's own vocabulary: text whose words are never a secret (contract §8).

Every word of this package's code: its routes, JSON keys, error codes, header values,
and the event names and markers of the CLIs it reads. A value found in it is no
random credential, and masking it would corrupt the protocol (a `.env` line
`X_TOKEN=rate_limit` would hide every `rate_limit`), so the redactor never holds one.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


@functools.cache
def own_vocabulary() -> str:
    """The text of this package's sources, read once (empty where they are absent)."""
    texts = []
    for folder, dirs, files in os.walk(_PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                try:
                    texts.append(Path(folder, name).read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError):
                    continue
    return "\n".join(texts)

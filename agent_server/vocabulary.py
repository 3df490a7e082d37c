"""The server's own vocabulary: the words no secret may be (contract §8).

Every word of this package's code: its routes, JSON keys, error codes, header values,
and the event names and markers of the CLIs it reads. A value found in one of them is
no random credential, and masking it would corrupt the protocol (a `.env` line
`X_TOKEN=rate_limit` would hide every `rate_limit`), so the redactor never holds one.
The words are kept, one a line, not the sources: about 90 KB against half a megabyte.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_WORD = re.compile(r"[A-Za-z0-9_./:@-]{3,}")
_NOT_THE_SERVERS = frozenset({"controller", "__pycache__"})
"""The controller library sits beside the server and speaks no protocol of its own."""


@functools.cache
def own_vocabulary() -> str:
    """The distinct words of this package's sources, one a line (empty where the sources
    are absent); read once."""
    words: set[str] = set()
    for folder, dirs, files in os.walk(_PACKAGE):
        dirs[:] = [d for d in dirs if d not in _NOT_THE_SERVERS]
        for name in files:
            if name.endswith(".py"):
                try:
                    words.update(_WORD.findall(Path(folder, name).read_text(encoding="utf-8")))
                except (OSError, UnicodeDecodeError):
                    continue
    return "\n".join(sorted(words))

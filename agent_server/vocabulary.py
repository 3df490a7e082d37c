"""The server's own vocabulary: the words no secret may be (contract §8).

Every word the server's code spells in a string: its routes, error codes, header
values, the values of its answers, and the event names, keys and markers of the CLIs
it reads. A value found in one of them is no random credential, and masking it would
corrupt the protocol (a `.env` line `X_TOKEN=rate_limit` would hide every
`rate_limit`), so the redactor never holds one. The words are kept, one a line: about
20 KB.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_LITERAL = re.compile(r"""(["'])((?:(?!\1)[^\\\n]|\\.){3,200}?)\1""")
"""A one-line string literal (a docstring's prose is no protocol)."""
_WORD = re.compile(r"[A-Za-z0-9_./:@-]{3,}")
_NOT_THE_SERVERS = frozenset({"controller", "__pycache__"})
"""The controller library sits beside the server and speaks no protocol of its own."""


@functools.cache
def own_vocabulary() -> str:
    """The distinct words of this package's string literals, one a line (empty where the
    sources are absent); read once."""
    words: set[str] = set()
    for folder, dirs, files in os.walk(_PACKAGE):
        dirs[:] = [d for d in dirs if d not in _NOT_THE_SERVERS]
        for name in files:
            if name.endswith(".py"):
                try:
                    source = Path(folder, name).read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                for literal in _LITERAL.finditer(source):
                    words.update(_WORD.findall(literal.group(2)))
    return "\n".join(sorted(words))

"""Token shapes: a credential the redactor was never told of, known by its look (contract §8).

`sk-ant-…`, and the value after `Authorization: Bearer` however it is printed, each in
any mix of cases. The regex is slow next to the redactor's one pass over its known
values, so `maybe_token` first rules out the texts that cannot hold a shape: most of
them.
"""

from __future__ import annotations

import re

# The value after "Bearer" in an Authorization header however it is printed:
# `Authorization: Bearer v`, a dict repr `'authorization': 'Bearer v'`, `Authorization=Bearer v`,
# or URL-encoded in a logged request line (`Authorization%3A+Bearer+v`).
_GAP = r"(?:\s|\+|%20)"
TOKEN_PATTERNS = re.compile(
    r"sk-ant-[A-Za-z0-9_\-]+"
    rf"|(?P<head>Authorization[\"']?{_GAP}*(?:[:=]|%3A|%3D){_GAP}*[\"']?Bearer{_GAP}+)"
    r"[^\s\"',;}&]+",
    re.IGNORECASE,
)
LONGEST_HINT = len("sk-ant-")
"""The longest text `maybe_token` looks for: a window of text that is shorter cannot
hold a whole hint."""
_FOLDS_TO_S_OR_K = ("\u017f", "\u212a")
"""The long s (U+017F) and the Kelvin sign (U+212A): the only letters beyond ASCII
that `TOKEN_PATTERNS` takes for a letter of `sk-ant-` or `bearer` (for s and k), as
the tests check."""


def maybe_token(text: str) -> bool:
    """False when `TOKEN_PATTERNS` cannot match `text`: every match holds `sk-ant-` or
    `bearer` in some mix of cases.

    ASCII letters are lowered, a text beyond ASCII as its UTF-8 bytes (faster than
    `str.lower`), where only the long s and the Kelvin sign could stand in for an s or k.
    """
    if text.isascii():
        lowered = text.lower()
        return "sk-ant-" in lowered or "earer" in lowered
    if any(letter in text for letter in _FOLDS_TO_S_OR_K):
        return True
    folded = text.encode("utf-8", errors="surrogatepass").lower()
    return b"sk-ant-" in folded or b"earer" in folded

"""One automaton over secret values and their JSON spellings (the redactor's matcher).

Aho-Corasick (`ahocorasick-rs`): the cost of a scan follows the text's length, not
the number of secrets. Each value is also matched as JSON escapes it, so a secret
holding a quote or a non-ASCII letter is found inside a raw stream-json line too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import ahocorasick_rs

MASK = "[REDACTED]"
SURROGATE = re.compile("[\ud800-\udfff]")


class Matcher:
    """One immutable Aho-Corasick automaton over the values and their JSON spellings."""

    def __init__(self, values: Iterable[str]) -> None:
        spellings: set[str] = set()
        for value in values:
            spellings.update(forms(value))
        self.longest = max(map(len, spellings), default=0)
        """The length of the longest form."""
        self._automaton = (
            ahocorasick_rs.AhoCorasick(
                sorted(spellings),
                matchkind=ahocorasick_rs.MatchKind.LeftmostLongest,
                implementation=ahocorasick_rs.Implementation.ContiguousNFA,
            )
            if spellings
            else None
        )

    def finds(self, text: str) -> bool:
        """True when any form occurs in `text` (which holds no lone surrogate)."""
        return self._automaton is not None and bool(self._automaton.find_matches_as_indexes(text))

    def mask(self, text: str) -> str:
        """`text` with every form masked, longest first (the same object if none matched).

        A lone surrogate (which no encoder takes) becomes U+FFFD first.
        """
        if self._automaton is None:
            return text
        try:
            matches = self._automaton.find_matches_as_indexes(text)
        except UnicodeEncodeError:
            text = SURROGATE.sub("\ufffd", text)
            matches = self._automaton.find_matches_as_indexes(text)
        if not matches:
            return text
        parts: list[str] = []
        last = 0
        for _, start, end in matches:
            parts.append(text[last:start])
            parts.append(MASK)
            last = end
        parts.append(text[last:])
        return "".join(parts)


def forms(value: str) -> tuple[str, str, str]:
    """A value as it is, and as JSON escapes it (`"` -> `\\"`, é -> `\\u00e9`)."""
    return value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]


def valid_text(text: str) -> str:
    """`text` with a lone surrogate (which no encoder takes) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return SURROGATE.sub("\ufffd", text)
    return text

"""The redactor: no secret leaves the server in a log line or an answer (contract §8).

It masks the exact value of every secret it has been told about, and token shapes
(`sk-ant-…`, the value after `Authorization: Bearer`; see `token_shapes`). Matching
is one Aho-Corasick pass (`ahocorasick-rs`), so its cost follows the text's length,
not the number of secrets times the length. Which values it holds:

- pinned, for the server's life: the controller token, the baseline's credentials,
  every reloaded token and every override a request carried (a rotated-out token
  must stay hidden);
- the credential values the current `.env` holds; a value that leaves `.env` is kept
  among the last `DEPARTED_LIMIT` departed values, then forgotten, so an agent that
  rewrites its `.env` cannot grow the redactor without bound.

Values shorter than `MIN_SECRET_LENGTH` are left alone (a false positive on every
short word costs more than it hides), and so is a value that occurs in the server's
own vocabulary (`own_vocabulary`: the words of its code, so its routes, keys, codes,
header values and the CLIs' event names): a `.env` holding `X_TOKEN=rate_limit` must
not mask the protocol, and no real credential is a word of it. Nor is a `.env` value
that occurs in a word the server itself wrote (`own`: a generation, an execution id)
or that is shaped as an instant (digits with `-`, `:`, `T`, `.`, `+`): the server's
own fields never read `[REDACTED]` (contract §8). A number is matched
as its text. Each value is also matched in its JSON-escaped spellings, so a secret
holding a quote or a non-ASCII character is found inside a raw stream-json line too.

The answer gate (`clean`, `dumps`) masks values, never a dictionary's keys: every
key of an answer is the server's own, or came from a CLI line that was redacted as
it arrived (contract §8), so no redaction can remove a key the server reads.
"""

from __future__ import annotations

import collections
import logging
import math
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from agent_server.redaction.matcher import MASK, SURROGATE, Matcher, valid_text
from agent_server.redaction.token_shapes import LONGEST_HINT, TOKEN_PATTERNS, maybe_token
from agent_server.redaction.vocabulary import own_vocabulary
from agent_server.secret_file import json_in_pieces

MIN_SECRET_LENGTH = 8
DEPARTED_LIMIT = 1024
"""How many values that left `.env` stay masked before the oldest is forgotten."""
OWN_LIMIT = 4096
"""How many of the server's own words (`Redactor.own`) are remembered, newest kept."""
_INSTANT = re.compile(r"[0-9][0-9:.+TZ -]*[:T.+-][0-9:.+TZ -]*")
"""A value of digits and an instant's punctuation, with some of it: a date, a time,
an instant or a decimal the server writes, never a credential."""
MAX_CLEAN_DEPTH = 64
"""Deeper JSON than this in an answer is replaced by `TOO_DEEP` (never a 500)."""
TOO_DEEP = "[nested too deep]"

LOG_EXTRA_FIELDS = ("key", "execution_id")
"""Log record attributes a formatter writes beside the message (redacted too)."""


class Redactor:
    """Masks known secret values and token patterns in text and JSON-like values."""

    def __init__(self, departed_limit: int = DEPARTED_LIMIT, vocabulary: str | None = None) -> None:
        self._vocabulary = own_vocabulary() if vocabulary is None else vocabulary
        """Text whose words are never secrets (the server's own code, by default)."""
        self._lock = threading.Lock()
        self._pinned: set[str] = set()
        self._dotenv: frozenset[str] = frozenset()
        self._dotenv_seen: frozenset[str] = frozenset()
        """What `.env` held last, words of ours included (the comparison's, not masked)."""
        self._dotenv_words: frozenset[str] = frozenset()
        """The values `.env` holds that are words of ours: never held. Nothing else of
        the kind is remembered, so what the redactor holds follows `.env`'s size."""
        self._own: collections.deque[str] = collections.deque(maxlen=OWN_LIMIT)
        """The server's own words: generations, execution ids (`own`)."""
        self._own_text = ""
        self._departed: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._departed_limit = departed_limit
        self._matcher: Matcher | None = Matcher(())

    # --- what it knows ---------------------------------------------------------------

    def add(self, values: Iterable[SecretStr | str | None]) -> None:
        """Mask these values from now on, for the server's life (never a word of ours)."""
        new = {v for v in _plain(values) if v not in self._pinned}
        new -= self._words_among(new, dotenv=False)
        if not new:
            return
        with self._lock:
            self._pinned |= new
            self._matcher = None

    def track_dotenv(self, values: Iterable[str]) -> None:
        """The credential values `.env` holds now; values that left it start to age out."""
        seen = frozenset(_plain(values))
        if seen == self._dotenv_seen:
            return
        # Only what is new needs a look.
        words = (self._dotenv_words & seen) | self._words_among(seen - self._dotenv_seen)
        self._dotenv_seen, self._dotenv_words = seen, words
        current = seen - words
        if current == self._dotenv:
            return
        with self._lock:
            for gone in self._dotenv - current:
                self._departed[gone] = None
                self._departed.move_to_end(gone)
            for back in current & self._departed.keys():
                del self._departed[back]
            while len(self._departed) > self._departed_limit:
                self._departed.popitem(last=False)
            self._dotenv = current
            self._matcher = None

    def own(self, words: Iterable[str]) -> None:
        """These are the server's own words (a generation, an execution id): never masked.

        A `.env` value that occurs in one is dropped from the values masked, now and
        whenever `.env` offers it again: a tool that copies a generation or another
        turn's id into `.env` cannot make the server's answers lie. Only the last
        `OWN_LIMIT` words are remembered.
        """
        added = [word for word in words if word and word not in self._own]
        if not added:
            return
        self._own.extend(added)
        self._own_text = "\n".join(self._own)
        held = self._dotenv | self._departed.keys()
        if clashing := {v for v in held if any(v in word for word in added)}:
            self._dotenv_words |= clashing & self._dotenv_seen
            with self._lock:
                self._dotenv -= clashing
                for value in clashing & self._departed.keys():
                    del self._departed[value]
                self._matcher = None

    def _words_among(self, values: set[str] | frozenset[str], *, dotenv: bool = True) -> set[str]:
        """The values that are words of ours, asked only of values never looked at
        before: in the server's vocabulary, and for `.env` values also in its own words
        (`own`) or shaped as an instant. A substring search a value: faster than
        building an automaton over the values, even for thousands of them."""
        return {
            value
            for value in values
            if value in self._vocabulary
            or (dotenv and (value in self._own_text or _INSTANT.fullmatch(value) is not None))
        }

    @property
    def size(self) -> int:
        """How many distinct secret values are masked now (not `__len__`: an empty
        redactor must never be falsy where `redactor or Redactor()` is written)."""
        return len(self._pinned | self._dotenv | self._departed.keys())

    # --- masking -----------------------------------------------------------------------

    def redact(self, text: str) -> str:
        """`text` with every known secret and token pattern masked (the same object if none)."""
        masked = self._current().mask(text)
        return TOKEN_PATTERNS.sub(_mask_token, masked) if maybe_token(masked) else masked

    def redact_bytes(self, data: bytes) -> bytes:
        """A raw output line with every secret masked (the same object if none was found)."""
        text = data.decode("utf-8", errors="replace")
        masked = self.redact(text)
        return data if masked is text else masked.encode("utf-8", errors="replace")

    def clean(self, value: Any) -> Any:
        """A JSON-safe copy of `value` for an answer: every string masked, surrogates
        replaced, non-finite numbers null, a number that spells a secret masked, and
        nothing nested deeper than `MAX_CLEAN_DEPTH`.

        `value` itself when none of that changes anything (the usual answer), which
        is found by one pass over its texts a batch at a time rather than one per text.
        """
        matcher = self._current()
        if _clean_already(value, matcher):
            return value
        return self._clean(value, matcher, 0)

    def serialise(self, value: Any) -> Serialised:
        """`dumps(value)`, kept with the secrets it was cleaned of, to answer with later."""
        matcher = self._current()
        return Serialised(self._dumps(value, matcher), matcher)

    def dumps(self, value: Any, earlier: Serialised | None = None) -> bytes:
        """`value` as compact UTF-8 JSON, cleaned as `clean` cleans it.

        Usually one serialisation and one scan of its text, not a walk through every
        value: JSON escapes a character at a time, so a secret in any string or key
        shows in the text as one of the escaped forms the matcher holds (a token
        shape as itself); a lone surrogate fails the text's encoding, a non-finite
        number or a type JSON cannot spell the serialisation. Only then, or when a
        match may span two strings or the nesting may be too deep, does `clean`
        decide value by value (a key that is not a string is then spelt by `str`,
        where JSON writes `true` or `null`: no answer has one).

        `earlier` is `serialise(value)` from before, `value` unchanged since: its bytes
        are the answer while the redactor has learnt no secret since.
        """
        matcher = self._current()
        if earlier is not None and earlier.matcher is matcher:
            return earlier.data
        return self._dumps(value, matcher)

    def _dumps(self, value: Any, matcher: Matcher) -> bytes:
        try:
            text = json_in_pieces(value)
        except (TypeError, ValueError, RecursionError):
            text = None
        if text is None or _too_deep(value, text) or not _text_clean(text, matcher):
            text = json_in_pieces(self._clean(value, matcher, 0))
        return text.encode("utf-8")

    def _clean(self, value: Any, matcher: Matcher, depth: int) -> Any:
        if isinstance(value, str):
            return self._clean_text(value, matcher)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int | float):
            if isinstance(value, float) and not math.isfinite(value):
                return None
            spelled = str(value)
            return MASK if matcher.mask(spelled) is not spelled else value
        if depth >= MAX_CLEAN_DEPTH:
            return TOO_DEEP
        if isinstance(value, dict):
            # Keys are the server's own or were masked as their line arrived: never masked
            # here, where the server may still read them (a key is only made valid text).
            return {
                valid_text(str(k)): self._clean(v, matcher, depth + 1) for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self._clean(v, matcher, depth + 1) for v in value]
        return self._clean_text(str(value), matcher)

    def _clean_text(self, text: str, matcher: Matcher) -> str:
        masked = matcher.mask(text)
        if maybe_token(masked):
            masked = TOKEN_PATTERNS.sub(_mask_token, masked)
        try:
            masked.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate, e.g. an emoji cut in half
            masked = SURROGATE.sub("\ufffd", masked)
        return masked

    def _current(self) -> Matcher:
        matcher = self._matcher
        if matcher is not None:
            return matcher
        with self._lock:
            if self._matcher is None:
                self._matcher = Matcher(self._pinned | self._dotenv | self._departed.keys())
            return self._matcher


@dataclass(frozen=True)
class Serialised:
    """A value's JSON from `Redactor.serialise`, and the matcher it was cleaned with: a
    redactor that learns a secret builds a new matcher, so the same one means no new
    secret since."""

    data: bytes
    matcher: Matcher


_CONTAINERS = (dict, list, tuple)


def _too_deep(value: Any, text: str) -> bool:
    """True when `value`, whose JSON is `text`, nests containers past `MAX_CLEAN_DEPTH`
    levels: never with fewer containers than that, otherwise found a level at a time."""
    if text.count("[") + text.count("{") <= MAX_CLEAN_DEPTH:
        return False
    level = [value]
    for _ in range(MAX_CLEAN_DEPTH):
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, _CONTAINERS)
        ]
        if not level:
            return False
    return True


_BATCH_CHARS = 64 * 1024
"""`_clean_already` checks texts joined in batches of about this many characters."""


def _clean_already(value: Any, matcher: Matcher) -> bool:
    """True when `Redactor._clean` would return `value` unchanged.

    That is: only JSON's types (dict with str keys, list, str, int, float, bool,
    None), no non-finite number, no container at `MAX_CLEAN_DEPTH`, and no secret,
    token shape or lone surrogate in any string, key or number's spelling. The texts
    are checked joined: whatever occurs in one text occurs in the join too, so a join
    with no match means no text has one; a match across a join's seam is only a
    false alarm, and `_clean` then decides text by text as always.
    """
    texts: list[str] = []
    size = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            texts.append(item)
            size += len(item)
        elif item is None or isinstance(item, bool):
            continue
        elif isinstance(item, int | float):
            if isinstance(item, float) and not math.isfinite(item):
                return False
            texts.append(str(item))
        elif depth >= MAX_CLEAN_DEPTH:
            return False
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return False
                texts.append(key)
                size += len(key)
                pending.append((child, depth + 1))
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
        else:
            return False  # a tuple or another type: `_clean` converts it
        if size >= _BATCH_CHARS:
            if not _texts_clean(texts, matcher):
                return False
            texts, size = [], 0
    return _texts_clean(texts, matcher)


def _text_clean(text: str, matcher: Matcher) -> bool:
    """`_texts_clean` of one long text, a window of `_BATCH_CHARS` at a time: a whole
    text's UTF-8 copies (the check's, the matcher's) would double a large answer.
    Windows overlap by as much as a match can span, so none falls between two."""
    overlap = max(matcher.longest, LONGEST_HINT) - 1
    step = max(_BATCH_CHARS, overlap)
    return all(
        _texts_clean([text[start : start + step + overlap]], matcher)
        for start in range(0, max(len(text), 1), step)
    )


def _texts_clean(texts: list[str], matcher: Matcher) -> bool:
    """True when no secret form, token shape or lone surrogate is in any of `texts`."""
    joined = "\n".join(texts)
    if maybe_token(joined):
        return False
    try:
        joined.encode("utf-8")  # a lone surrogate fails here
    except UnicodeEncodeError:
        return False
    return not matcher.finds(joined)


def _plain(values: Iterable[SecretStr | str | None]) -> set[str]:
    """The usable secret strings among `values` (at least `MIN_SECRET_LENGTH` long)."""
    found = set()
    for value in values:
        plain = value.get_secret_value() if isinstance(value, SecretStr) else value
        if plain and len(plain) >= MIN_SECRET_LENGTH:
            found.add(plain)
    return found


def _mask_token(match: re.Match[str]) -> str:
    """Keep the `Authorization: Bearer ` prefix, mask what follows (or the whole `sk-ant-…`)."""
    return (match.group("head") or "") + MASK


class RedactingFilter(logging.Filter):
    """A handler filter that renders each record's message and masks it."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the record's message (and extra fields) with redacted text; never drops."""
        record.msg = self.redactor.redact(record.getMessage())
        record.args = None
        for name in LOG_EXTRA_FIELDS:
            value = getattr(record, name, None)
            if isinstance(value, str):
                setattr(record, name, self.redactor.redact(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.redact(record.exc_text)
        return True

"""Where an answer's body ends in the bytes its upstream sends (RFC 9112 §6). Pure.

The broker relays an answer's body as it arrives, framing and all, so the CLI reads
the bytes the upstream wrote. It parses only enough of the framing to find the body's
end (the connection then serves the next request) and, for a refusal, to read its
first bytes decoded. A chunk's data is never looked at: a 64 KiB chunk costs the same
as a 6-byte one.
"""

from __future__ import annotations

import enum

MAX_LINE_BYTES = 4096
"""A chunk-size line or trailer line longer than this is not HTTP from an API."""
_HEX = frozenset(b"0123456789abcdefABCDEF")


class FramingError(ValueError):
    """The upstream's body framing is broken: the connection cannot be trusted further."""


class _Mode(enum.Enum):
    EMPTY = "empty"
    LENGTH = "length"
    CHUNKED = "chunked"
    UNTIL_CLOSE = "until close"


class _Step(enum.Enum):
    SIZE = "size"
    DATA = "data"
    DATA_END = "data end"
    TRAILER = "trailer"


class BodyFraming:
    """One answer's body framing: `feed` bytes as they arrive; `done` once it ended."""

    def __init__(self, *, empty: bool, chunked: bool, length: int | None) -> None:
        if empty:
            self._mode = _Mode.EMPTY
        elif chunked:
            self._mode = _Mode.CHUNKED
        elif length is not None:
            self._mode = _Mode.LENGTH
        else:
            self._mode = _Mode.UNTIL_CLOSE
        self._remaining = length or 0
        self._step = _Step.SIZE
        self._line = bytearray()
        self.done = self._mode is _Mode.EMPTY or (self._mode is _Mode.LENGTH and not length)

    @property
    def until_close(self) -> bool:
        """True when the body ends only with the connection (neither length nor chunks)."""
        return self._mode is _Mode.UNTIL_CLOSE

    def feed(self, data: bytes, keep: bytearray | None = None, limit: int = 0) -> int:
        """Take `data`; answer how many of its bytes are the body's (fewer than all only
        when the body ended inside it). With `keep`, the body's decoded bytes are added
        to it until it holds `limit`."""
        if self.done:
            return 0
        if self._mode is _Mode.UNTIL_CLOSE:
            _keep(keep, limit, data, 0, len(data))
            return len(data)
        if self._mode is _Mode.LENGTH:
            taken = min(self._remaining, len(data))
            _keep(keep, limit, data, 0, taken)
            self._remaining -= taken
            self.done = self._remaining == 0
            return taken
        return self._chunks(data, keep, limit)

    def feed_eof(self) -> None:
        """The connection ended: a body framed by it is done, any other is cut short."""
        if self._mode is _Mode.UNTIL_CLOSE:
            self.done = True
        elif not self.done:
            msg = "the upstream closed the connection inside an answer's body"
            raise FramingError(msg)

    def _chunks(self, data: bytes, keep: bytearray | None, limit: int) -> int:
        """The chunked framing's state machine over `data`, from where the last left off."""
        at, end = 0, len(data)
        while at < end and not self.done:
            if self._step is _Step.DATA:
                taken = min(self._remaining, end - at)
                _keep(keep, limit, data, at, at + taken)
                at += taken
                self._remaining -= taken
                if self._remaining == 0:
                    self._step = _Step.DATA_END
                continue
            newline = data.find(b"\n", at)
            stop = end if newline < 0 else newline + 1
            self._line += data[at:stop]
            at = stop
            if len(self._line) > MAX_LINE_BYTES:
                msg = "a chunk framing line is too long"
                raise FramingError(msg)
            if newline >= 0:
                self._end_of_line(bytes(self._line).rstrip(b"\r\n"))
                self._line.clear()
        return at

    def _end_of_line(self, line: bytes) -> None:
        """One whole framing line: a chunk's size, the end of its data, or a trailer."""
        if self._step is _Step.SIZE:
            digits = line.split(b";", 1)[0].strip()
            if not digits or len(digits) > 16 or not set(digits) <= _HEX:
                msg = "a chunk size is not hexadecimal"
                raise FramingError(msg)
            self._remaining = int(digits, 16)
            self._step = _Step.DATA if self._remaining else _Step.TRAILER
        elif self._step is _Step.DATA_END:
            if line:
                msg = "a chunk's data runs past its size"
                raise FramingError(msg)
            self._step = _Step.SIZE
        elif not line:  # the empty line after the trailers: the body's end
            self.done = True


def _keep(keep: bytearray | None, limit: int, data: bytes, start: int, stop: int) -> None:
    if keep is not None and len(keep) < limit and stop > start:
        keep += data[start : min(stop, start + limit - len(keep))]

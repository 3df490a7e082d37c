"""Images for turns: a real 1x1 PNG, and bodies that sit just past each limit."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

from tests.support.fake_cli import fingerprint


def png(red: int = 255, green: int = 0, blue: int = 0) -> bytes:
    """A valid 1x1 RGB PNG of one colour."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(bytes([0, red, green, blue]))
    body = chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def image(data: bytes, media_type: str = "image/png") -> dict[str, Any]:
    """One `images` entry of a turn body."""
    return {"media_type": media_type, "data": base64.b64encode(data).decode()}


def data_fingerprint(entry: dict[str, Any]) -> str:
    """sha256-12 of an entry's base64 text: what the fake CLI and the stand-in report."""
    return fingerprint(entry["data"])


ONE_IMAGE = image(png())

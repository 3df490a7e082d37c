"""The agent's one ongoing chat: its session id, kept in the state dir (contract §6).

Chats run one at a time (`lock`); the id survives a restart and a credential
change, so every chat turn `--resume`s the same conversation.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from agent_server.runtimes.events import as_session_id
from agent_server.secret_file import read_bounded, write_secret_file

logger = logging.getLogger("agent_server.chat")

MAX_SESSION_ID_BYTES = 256


class ChatSession:
    """The chat's session id file and the lock that serialises chat turns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = asyncio.Lock()

    async def acquire_unless(self, cancel: asyncio.Event) -> bool:
        """Take the chat's turn, unless `cancel` is set first: True if taken (then the
        caller must `release` it)."""
        acquire = asyncio.ensure_future(self.lock.acquire())
        stopped = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({acquire, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not acquire.done():
                acquire.cancel()
        taken = acquire.done() and not acquire.cancelled()
        if taken and cancel.is_set():
            self.lock.release()  # both at once: a terminate wins over a late start
            return False
        return taken

    def release(self) -> None:
        """Let the next chat turn run."""
        self.lock.release()

    def current(self) -> str | None:
        """The session id to resume, or None before the first chat turn (or when the file
        is not a small regular file: it is never waited on, contract §10)."""
        try:
            value = read_bounded(self.path, MAX_SESSION_ID_BYTES).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return as_session_id(value)

    def remember(self, session_id: str) -> None:
        """Keep `session_id` for the next chat turn (atomic; a failure is logged)."""
        if session_id == self.current() or as_session_id(session_id) is None:
            return
        try:
            write_secret_file(self.path, session_id)
        except OSError as exc:
            logger.error("could not keep the chat session id in %s: %s", self.path, exc)

"""A live answer of one turn: asked of a real server once, read by every test of a module."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from tests.support.server import ServerProcess


@dataclass(frozen=True)
class LiveAnswer:
    """What `POST /api/task` answered to `sent`, and when it was asked and answered."""

    status: int
    headers: httpx.Headers
    json: dict[str, Any]
    text: str
    sent: dict[str, Any]
    asked_at: datetime
    answered_at: datetime

    @classmethod
    def ask(cls, server: ServerProcess, body: dict[str, Any], *, timeout: float = 60) -> LiveAnswer:
        """Post `body` to the server's `/api/task` and keep its answer."""
        asked_at = datetime.now(UTC)
        with server.client(timeout=timeout) as client:
            response = client.post("/api/task", json=body)
        return cls(
            response.status_code,
            response.headers,
            response.json(),
            response.text,
            body,
            asked_at,
            datetime.now(UTC),
        )

    @property
    def detail(self) -> dict[str, Any]:
        """The error body's `detail` (a failed turn's)."""
        detail = self.json["detail"]
        assert isinstance(detail, dict), self.text
        return detail

    def report(self) -> dict[str, Any]:
        """A fake CLI's JSON report of what it received (a success's response)."""
        report: dict[str, Any] = json.loads(self.json["response"])
        return report

"""What the loopback API stand-ins share: an answer chosen by the credential a request carries.

A test picks an outcome by picking the credential: `api.on(credential, scenario)`, or a
credential holding one of the stand-in's substrings (`ratelimit`, `badauth`, ...). Only
fingerprints of credentials are ever kept; `requests` lists what was received.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from starlette.types import ASGIApp

from tests.support.thread_server import ThreadServer

S = TypeVar("S")


def fingerprint(value: str) -> str:
    """The first 12 hex digits of the sha256 of `value` (what the stand-ins report)."""
    return hashlib.sha256(value.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ApiRequest:
    """One request a stand-in received; its credential appears only as a fingerprint."""

    path: str
    model: str | None
    fingerprint: str | None
    scenario: str
    system_text: str
    """Every system or developer text the request carried, joined."""
    user_text: str
    """Every user text the request carried, joined."""
    received_at: float


class CredentialStandIn(ThreadServer, Generic[S]):
    """A stand-in whose scenario is chosen by credential: `on()` first, then substrings."""

    def __init__(
        self,
        app: ASGIApp,
        name: str,
        *,
        substrings: Sequence[tuple[str, S]],
        success: S,
        missing: S,
    ) -> None:
        super().__init__(app, name)
        self._substrings = tuple(substrings)
        self._success = success
        self._missing = missing
        self._lock = threading.Lock()
        self._scenarios: dict[str, S] = {}
        self._requests: list[ApiRequest] = []

    def on(self, credential: str, scenario: S) -> None:
        """Answer every request carrying `credential` with `scenario`."""
        with self._lock:
            self._scenarios[credential] = scenario

    def scenario_for(self, credential: str | None) -> S:
        """The scenario of `credential`: `on()`, then its substrings, then success."""
        if not credential:
            return self._missing
        with self._lock:
            chosen = self._scenarios.get(credential)
        if chosen is not None:
            return chosen
        lowered = credential.lower()
        for needle, scenario in self._substrings:
            if needle in lowered:
                return scenario
        return self._success

    @property
    def requests(self) -> list[ApiRequest]:
        """A copy of the requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def by_credential(self, credential: str) -> list[ApiRequest]:
        """The requests that carried `credential`."""
        wanted = fingerprint(credential)
        return [request for request in self.requests if request.fingerprint == wanted]

    def record(
        self,
        path: str,
        *,
        model: str | None,
        credential: str | None,
        scenario: str,
        texts: Mapping[str, Sequence[str]],
    ) -> None:
        """Keep one request: `texts` holds its `system` and `user` texts."""
        request = ApiRequest(
            path=path,
            model=model,
            fingerprint=fingerprint(credential) if credential else None,
            scenario=scenario,
            system_text="\n".join(texts.get("system", ())),
            user_text="\n".join(texts.get("user", ())),
            received_at=time.time(),
        )
        with self._lock:
            self._requests.append(request)

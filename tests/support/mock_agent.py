"""An agent-server answered in-process: an `httpx.MockTransport` that speaks the contract.

For the walk's unit tests: each turn is answered by the credential it carries (its
override's secret, or the server's own held token when the server is `legacy` and
ignores overrides), as a scripted verdict; reload-token is a compare-and-set on the
server's generation. What the walk sent is kept (`turns`, `reloads`). A real server
and the real CLI play the same scenes in tests/e2e/controller/.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import SecretStr

from agent_server.controller import AgentClient

_STATUS = {"rate_limit": 429, "billing": 402, "auth": 503, "model_unsupported": 400}


def fingerprint(secret: str) -> str:
    """The server's `sha256:` + 12 hex digits of a secret."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:12]


@dataclass
class Verdict:
    """How the API treats one credential: serves (`error_code` None) or refuses."""

    error_code: str | None = None
    resets_at: datetime | None = None
    reading: dict[str, Any] | None = None
    """The turn's `metadata.rate_limit`."""


@dataclass
class MockAgent:
    """One agent-server (module docstring)."""

    verdicts: dict[str, Verdict]
    """By secret; a secret not here serves."""
    held: str | None = None
    """The server's own token (what reload-token sets)."""
    legacy: bool = False
    """Older than per-spawn overrides: runs `held`, never echoes the override header."""
    generation: int = 1
    turns: list[dict[str, Any]] = field(default_factory=list)
    """Each turn's body as sent, with `ran` (the secret it ran on) added."""
    reloads: list[dict[str, Any]] = field(default_factory=list)
    retained: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The served turns' answers by execution id (`GET …/result`)."""

    def client(self) -> AgentClient:
        """A client of this server, over the mock transport."""
        transport = httpx.MockTransport(self._answer)
        return AgentClient("http://agent.test", SecretStr("ctl-token"), transport=transport)

    def ran(self) -> list[str | None]:
        """The secret each turn ran on, in order."""
        return [turn["ran"] for turn in self.turns]

    def _answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        if request.url.path == "/api/credentials/reload-token":
            return self._reload(body)
        if request.url.path == "/api/task":
            return self._turn(body)
        kept = self.retained.get(request.url.path.removeprefix("/api/executions/").split("/")[0])
        if request.url.path.endswith("/result") and kept is not None:
            return httpx.Response(200, json=kept)
        return httpx.Response(404, json={"detail": {"error_code": "not_found", "message": "-"}})

    def _reload(self, body: dict[str, Any]) -> httpx.Response:
        self.reloads.append(body)
        expected = body.get("expected_generation")
        if expected is not None and expected != self.generation:
            detail = {"message": "stale", "error_code": "generation_mismatch"}
            return httpx.Response(409, json={"detail": detail | _flags()})
        self.held, self.generation = body["token"], self.generation + 1
        answer = {"changed": True, "generation": self.generation, "env_shadow": []}
        return httpx.Response(200, json=answer | {"fingerprint": fingerprint(self.held)})

    def _turn(self, body: dict[str, Any]) -> httpx.Response:
        override = body.get("auth_override")
        secret = None if self.legacy or override is None else next(iter(_secrets(override)))
        kind = None if secret is None else next(iter(override))
        ran = secret if secret is not None else self.held
        self.turns.append(body | {"ran": ran})
        headers = {"X-Trinity-Auth-Override": kind} if kind else {}
        verdict = self.verdicts.get(ran or "", Verdict())
        metadata = {
            "execution_id": body["execution_id"],
            "context_window": 200000,
            "auth_route": kind or "baseline",
            "generation": self.generation,
            "fingerprint": fingerprint(ran) if ran else None,
            "rate_limit": verdict.reading,
        }
        if verdict.error_code is None:
            answer = {
                "status": "success",
                "response": "done",
                "execution_log": [],
                "session_id": None,
                "timestamp": datetime.now(UTC).isoformat(),
                "metadata": metadata,
            }
            self.retained[body["execution_id"]] = _envelope(answer, kind)
            return httpx.Response(200, json=answer, headers=headers)
        code = verdict.error_code
        detail = {
            "message": code,
            "error_code": code,
            "retryable": False,
            "switch_credential": code in ("rate_limit", "billing", "auth"),
            "execution_id": body["execution_id"],
            "auth_route": kind or "baseline",
            "api_error_status": _STATUS[code],
            "resets_at": verdict.resets_at.isoformat() if verdict.resets_at else None,
            "rate_limit_type": "five_hour" if code == "rate_limit" else None,
            "metadata": metadata,
            "execution_log": [],
        }
        return httpx.Response(_STATUS[code], json={"detail": detail}, headers=headers)


def _secrets(override: dict[str, Any]) -> list[str]:
    if "provider" in override:
        return [override["provider"]["auth_token"]]
    return [value for value in override.values() if isinstance(value, str)]


def _flags() -> dict[str, bool]:
    return {"retryable": False, "switch_credential": False}


def _envelope(answer: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """A served turn as `GET /api/executions/{id}/result` answers it (contract §6.6)."""
    return {
        "execution_id": answer["metadata"]["execution_id"],
        "status": "success",
        "response": answer["response"],
        "response_truncated": False,
        "error": None,
        "error_code": None,
        "terminal_reason": "completed",
        "session_id": None,
        "metadata": answer["metadata"],
        "execution_log": [],
        "truncated_log": False,
        "execution_time_ms": 5,
        "auth_route": kind or "baseline",
        "http_status": 200,
        "detail": None,
        "retained_at": answer["timestamp"],
    }

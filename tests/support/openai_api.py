"""A loopback stand-in for the OpenAI Responses API, for the real Codex CLI.

Codex ignores `OPENAI_BASE_URL` alone: it reaches the stand-in through a model provider
in `$CODEX_HOME/config.toml` (`write_codex_home`), which sends `OPENAI_API_KEY` as
`Authorization: Bearer`. Each turn is one `POST /v1/responses` with `"stream": true`,
answered as server-sent events; an error is the API's JSON error body and status.

The outcome is chosen by the bearer credential (`api.on(key, ResponsesScenario.X)`, or a
substring of `SUBSTRINGS`); an unknown model (`UNKNOWN_MODEL`) answers 404. A success
answers `served-by fp=<sha256-12 of the key>`.

    with ResponsesApiStandIn() as api:
        home = api.write_codex_home(tmp_path / "codex-home")
        ...  # run codex with CODEX_HOME=home, OPENAI_API_KEY=...
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.api_stand_in import CredentialStandIn, fingerprint

MODEL = "gpt-5.1-codex"
UNKNOWN_MODEL = "gpt-nonexistent-9"
FLAKY_FAILURES = 5
"""A flaky key's first requests that fail: past Codex's silent retries, so it reconnects."""
PROVIDER = "standin"
"""The model provider `write_codex_home` configures."""
USAGE = {
    "input_tokens": 1500,
    "input_tokens_details": {"cached_tokens": 1200},
    "output_tokens": 5,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 1505,
}


class ResponsesScenario(enum.StrEnum):
    """What the stand-in answers to one `POST /v1/responses`."""

    SUCCESS = "success"
    RATE_LIMIT = "rate_limit"  # 429 rate_limit_exceeded: a per-key request limit
    USAGE_LIMIT = "usage_limit"  # 429 usage_limit_reached with resets_at: a plan's wall
    QUOTA = "quota"  # 429 insufficient_quota: no credit left
    AUTH_401 = "auth_401"  # 401 invalid_api_key
    MODEL_NOT_FOUND = "model_not_found"  # 404 model_not_found
    SERVER_ERROR = "server_error"  # 500
    UNAVAILABLE = "unavailable"  # 503
    FLAKY = "flaky"  # 503 to a key's first FLAKY_FAILURES requests, then success


SUBSTRINGS: tuple[tuple[str, ResponsesScenario], ...] = (
    ("ratelimit", ResponsesScenario.RATE_LIMIT),
    ("usagelimit", ResponsesScenario.USAGE_LIMIT),
    ("nocredit", ResponsesScenario.QUOTA),
    ("badauth", ResponsesScenario.AUTH_401),
    ("servererror", ResponsesScenario.SERVER_ERROR),
    ("unavailable", ResponsesScenario.UNAVAILABLE),
    ("flaky", ResponsesScenario.FLAKY),
)
"""Substring of the key -> scenario, checked in this order."""


def _error(status: int, error: dict[str, Any]) -> Response:
    """The API's error body (`{"error": {...}}`) with `status`."""
    return JSONResponse({"error": error}, status, headers={"x-request-id": "req_mock"})


def _sse(text: str, model: str) -> Iterator[bytes]:
    """A streamed reply of one assistant message, then `response.completed` with usage."""
    message = {
        "type": "message",
        "id": "msg_mock",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_mock", "model": model}},
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {"type": "response.output_text.delta", "output_index": 0, "delta": text},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {"type": "response.completed", "response": {"id": "resp_mock", "usage": USAGE}},
    ]
    for event in events:
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def _texts(body: object) -> dict[str, list[str]]:
    """The request's system texts (`instructions`, developer and system messages) and user
    texts."""
    texts: dict[str, list[str]] = {"system": [], "user": []}
    if not isinstance(body, dict):
        return texts
    if isinstance(body.get("instructions"), str):
        texts["system"].append(body["instructions"])
    items = body.get("input")
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        role = "user" if item.get("role") == "user" else "system"
        content = item.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                texts[role].append(block["text"])
    return texts


class ResponsesApiStandIn(CredentialStandIn[ResponsesScenario]):
    """The Responses API on 127.0.0.1, in a uvicorn thread; `reset_in_s` sets when a
    usage limit resets."""

    def __init__(self, *, reset_in_s: int = 3600) -> None:
        self.reset_in_s = reset_in_s
        app = Starlette(
            routes=[
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/{path:path}", self._unknown, methods=["GET", "POST", "HEAD", "PUT"]),
            ]
        )
        super().__init__(
            app,
            "responses-api",
            substrings=SUBSTRINGS,
            success=ResponsesScenario.SUCCESS,
            missing=ResponsesScenario.AUTH_401,
        )

    def write_codex_home(self, home: Path, *, model: str = MODEL) -> Path:
        """A `CODEX_HOME` whose config.toml sends every turn to this stand-in."""
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'model = "{model}"\n'
            f'model_provider = "{PROVIDER}"\n\n'
            f"[model_providers.{PROVIDER}]\n"
            'name = "Responses API stand-in"\n'
            f'base_url = "{self.base_url}/v1"\n'
            'env_key = "OPENAI_API_KEY"\n'
            'wire_api = "responses"\n'
        )
        return home

    async def _responses(self, request: Request) -> Response:
        authorization = request.headers.get("authorization", "")
        key = authorization[7:].strip() if authorization.lower().startswith("bearer ") else None
        try:
            body = await request.json()
        except ValueError:
            body = {}
        model = body.get("model") if isinstance(body, dict) else None
        scenario = self.scenario_for(key)
        if scenario is ResponsesScenario.SUCCESS and model == UNKNOWN_MODEL:
            scenario = ResponsesScenario.MODEL_NOT_FOUND
        if (
            scenario is ResponsesScenario.FLAKY
            and len(self.by_credential(key or "")) >= FLAKY_FAILURES
        ):
            scenario = ResponsesScenario.SUCCESS
        self.record(
            request.url.path,
            model=model if isinstance(model, str) else None,
            credential=key,
            scenario=scenario,
            texts=_texts(body),
        )
        return self._answer(scenario, key or "", str(model))

    def _answer(self, scenario: ResponsesScenario, key: str, model: str) -> Response:
        match scenario:
            case ResponsesScenario.SUCCESS:
                return StreamingResponse(
                    _sse(f"served-by fp={fingerprint(key)}", model),
                    media_type="text/event-stream",
                )
            case ResponsesScenario.RATE_LIMIT:
                return _error(
                    429,
                    {
                        "message": f"Rate limit reached for {model} in organization org-mock on "
                        "requests per min (RPM): Limit 3, Used 3, Requested 1. "
                        "Please try again in 1s.",
                        "type": "requests",
                        "param": None,
                        "code": "rate_limit_exceeded",
                    },
                )
            case ResponsesScenario.USAGE_LIMIT:
                resets_at = int(time.time()) + self.reset_in_s
                return _error(
                    429,
                    {
                        "type": "usage_limit_reached",
                        "message": "The usage limit has been reached",
                        "plan_type": "plus",
                        "resets_at": resets_at,
                        "resets_in_seconds": self.reset_in_s,
                    },
                )
            case ResponsesScenario.QUOTA:
                return _error(
                    429,
                    {
                        "message": "You exceeded your current quota, please check your plan "
                        "and billing details.",
                        "type": "insufficient_quota",
                        "param": None,
                        "code": "insufficient_quota",
                    },
                )
            case ResponsesScenario.AUTH_401:
                return _error(
                    401,
                    {
                        "message": "Incorrect API key provided. You can find your API key at "
                        "https://platform.openai.com/account/api-keys.",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "invalid_api_key",
                    },
                )
            case ResponsesScenario.MODEL_NOT_FOUND:
                return _error(
                    404,
                    {
                        "message": f"The model `{model}` does not exist or you do not have "
                        "access to it.",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "model_not_found",
                    },
                )
            case ResponsesScenario.SERVER_ERROR:
                return _error(
                    500,
                    {
                        "message": "The server had an error while processing your request. "
                        "Sorry about that!",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    },
                )
            case ResponsesScenario.UNAVAILABLE | ResponsesScenario.FLAKY:
                return _error(
                    503,
                    {
                        "message": "The engine is currently overloaded, please try again later.",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    },
                )

    async def _unknown(self, request: Request) -> Response:
        self.record(
            request.url.path, model=None, credential=None, scenario="unknown_route", texts={}
        )
        return _error(404, {"message": f"Not found: {request.url.path}", "type": "not_found"})

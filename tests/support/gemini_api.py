"""A loopback stand-in for the Gemini API, for the real Gemini CLI.

The CLI reaches it through `GOOGLE_GEMINI_BASE_URL`, sending `GEMINI_API_KEY` as
`x-goog-api-key`. A turn is `POST /v1beta/models/<model>:streamGenerateContent?alt=sse`
(its answer server-sent events of `GenerateContentResponse`s); `:generateContent` and
`:countTokens` are answered too. An error is Google's JSON error body
(`{"error": {"code", "message", "status", "details"}}`) with its status.

The outcome is chosen by the API key (`api.on(key, GeminiScenario.X)`, or a substring of
`SUBSTRINGS`); an unknown model (`UNKNOWN_MODEL`) answers 404. A success answers
`served-by fp=<sha256-12 of the key>`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.api_stand_in import CredentialStandIn, fingerprint

MODEL = "gemini-2.5-flash"
UNKNOWN_MODEL = "gemini-nonexistent-9"
USAGE = {
    "promptTokenCount": 1500,
    "candidatesTokenCount": 5,
    "totalTokenCount": 1505,
    "cachedContentTokenCount": 1200,
}
_TYPE = "type.googleapis.com/google.rpc."


class GeminiScenario(enum.StrEnum):
    """What the stand-in answers to one generate call."""

    SUCCESS = "success"
    RATE_LIMIT = "rate_limit"  # 429 RESOURCE_EXHAUSTED, a per-minute quota, RetryInfo 3600s
    QUOTA = "quota"  # 429 RESOURCE_EXHAUSTED, a per-day quota
    KEY_INVALID = "key_invalid"  # 400 INVALID_ARGUMENT API_KEY_INVALID (what a bad key gets)
    AUTH_401 = "auth_401"  # 401 UNAUTHENTICATED
    MODEL_NOT_FOUND = "model_not_found"  # 404 NOT_FOUND
    SERVER_ERROR = "server_error"  # 500 INTERNAL
    UNAVAILABLE = "unavailable"  # 503 UNAVAILABLE


SUBSTRINGS: tuple[tuple[str, GeminiScenario], ...] = (
    ("ratelimit", GeminiScenario.RATE_LIMIT),
    ("nocredit", GeminiScenario.QUOTA),
    ("badkey", GeminiScenario.KEY_INVALID),
    ("badauth", GeminiScenario.AUTH_401),
    ("servererror", GeminiScenario.SERVER_ERROR),
    ("unavailable", GeminiScenario.UNAVAILABLE),
)
"""Substring of the key -> scenario, checked in this order."""


def _error(code: int, status: str, message: str, details: list[dict[str, Any]]) -> Response:
    """Google's error body with `code` as the HTTP status."""
    body = {"error": {"code": code, "message": message, "status": status, "details": details}}
    return JSONResponse(body, code)


def _quota_failure(quota_id: str, model: str) -> dict[str, Any]:
    metric = "generativelanguage.googleapis.com/generate_content_free_tier_requests"
    return {
        "@type": _TYPE + "QuotaFailure",
        "violations": [
            {
                "quotaMetric": metric,
                "quotaId": quota_id,
                "quotaDimensions": {"location": "global", "model": model},
                "quotaValue": "10",
            }
        ],
    }


def _reply(text: str, model: str) -> dict[str, Any]:
    return {
        "candidates": [
            {
                "content": {"parts": [{"text": text}], "role": "model"},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": USAGE,
        "modelVersion": model,
        "responseId": "resp-mock",
    }


def _sse(text: str, model: str) -> Iterator[bytes]:
    yield f"data: {json.dumps(_reply(text, model))}\r\n\r\n".encode()


def _texts(body: object) -> dict[str, list[str]]:
    """The request's `systemInstruction` texts and its user texts."""
    texts: dict[str, list[str]] = {"system": [], "user": []}
    if not isinstance(body, dict):
        return texts
    system = body.get("systemInstruction")
    for content, role in [(system, "system")] + [(c, "user") for c in body.get("contents") or []]:
        if not isinstance(content, dict) or (role == "user" and content.get("role") != "user"):
            continue
        for part in content.get("parts") or []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts[role].append(part["text"])
    return texts


class GeminiApiStandIn(CredentialStandIn[GeminiScenario]):
    """The Gemini API on 127.0.0.1, in a uvicorn thread."""

    def __init__(self) -> None:
        app = Starlette(
            routes=[
                Route("/{version}/models/{call:path}", self._generate, methods=["POST"]),
                Route("/{path:path}", self._unknown, methods=["GET", "POST", "HEAD", "PUT"]),
            ]
        )
        super().__init__(
            app,
            "gemini-api",
            substrings=SUBSTRINGS,
            success=GeminiScenario.SUCCESS,
            missing=GeminiScenario.AUTH_401,
        )

    async def _generate(self, request: Request) -> Response:
        model, _, method = request.path_params["call"].partition(":")
        key = request.headers.get("x-goog-api-key") or request.query_params.get("key")
        try:
            body = await request.json()
        except ValueError:
            body = {}
        scenario = self.scenario_for(key)
        if scenario is GeminiScenario.SUCCESS and model == UNKNOWN_MODEL:
            scenario = GeminiScenario.MODEL_NOT_FOUND
        self.record(
            request.url.path, model=model, credential=key, scenario=scenario, texts=_texts(body)
        )
        if scenario is GeminiScenario.SUCCESS:
            text = f"served-by fp={fingerprint(key or '')}"
            if method == "countTokens":
                return JSONResponse({"totalTokens": 10})
            if method == "streamGenerateContent":
                return StreamingResponse(_sse(text, model), media_type="text/event-stream")
            return JSONResponse(_reply(text, model))
        return self._failure(scenario, model)

    def _failure(self, scenario: GeminiScenario, model: str) -> Response:
        match scenario:
            case GeminiScenario.RATE_LIMIT:
                return _error(
                    429,
                    "RESOURCE_EXHAUSTED",
                    "You exceeded your current quota, please check your plan and billing "
                    "details.\n* Quota exceeded for metric: generate_content_free_tier_requests, "
                    f"limit: 10, model: {model}\nPlease retry in 3600s.",
                    [
                        _quota_failure("GenerateRequestsPerMinutePerProjectPerModel", model),
                        {"@type": _TYPE + "RetryInfo", "retryDelay": "3600s"},
                    ],
                )
            case GeminiScenario.QUOTA:
                return _error(
                    429,
                    "RESOURCE_EXHAUSTED",
                    "You exceeded your current quota, please check your plan and billing "
                    "details.\n* Quota exceeded for metric: generate_content_free_tier_requests, "
                    f"limit: 250, model: {model}",
                    [_quota_failure("GenerateRequestsPerDayPerProjectPerModel-FreeTier", model)],
                )
            case GeminiScenario.KEY_INVALID:
                return _error(
                    400,
                    "INVALID_ARGUMENT",
                    "API key not valid. Please pass a valid API key.",
                    [
                        {
                            "@type": _TYPE + "ErrorInfo",
                            "reason": "API_KEY_INVALID",
                            "domain": "googleapis.com",
                            "metadata": {"service": "generativelanguage.googleapis.com"},
                        }
                    ],
                )
            case GeminiScenario.AUTH_401:
                return _error(
                    401,
                    "UNAUTHENTICATED",
                    "Request had invalid authentication credentials. Expected OAuth 2 access "
                    "token, login cookie or other valid authentication credential.",
                    [],
                )
            case GeminiScenario.MODEL_NOT_FOUND:
                return _error(
                    404,
                    "NOT_FOUND",
                    f"models/{model} is not found for API version v1beta, or is not supported "
                    "for generateContent. Call ListModels to see the list of available models "
                    "and their supported methods.",
                    [],
                )
            case GeminiScenario.SERVER_ERROR:
                return _error(500, "INTERNAL", "An internal error has occurred.", [])
            case _:
                return _error(
                    503, "UNAVAILABLE", "The model is overloaded. Please try again later.", []
                )

    async def _unknown(self, request: Request) -> Response:
        self.record(
            request.url.path, model=None, credential=None, scenario="unknown_route", texts={}
        )
        return _error(404, "NOT_FOUND", f"Not found: {request.url.path}", [])

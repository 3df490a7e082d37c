"""A loopback stand-in for the Anthropic Messages API, for the real Claude Code CLI.

The real CLI reaches it through ``ANTHROPIC_BASE_URL=http://127.0.0.1:<port>``. With a
loopback base URL, Claude Code 2.1.328 calls exactly one endpoint per turn:
``POST /v1/messages?beta=true`` with ``"stream": true`` (an SSE answer). The other
routes below (``count_tokens``, a catch-all) exist so an unexpected call is recorded
and answered in the API's error shape instead of hanging.

The outcome of a request is chosen by the CREDENTIAL it carries, so a test picks the
outcome by picking the token: ``api.on(token, Scenario.RATE_LIMIT_FIVE_HOUR)``, or a
token containing one of the substrings in ``DEFAULT_SUBSTRING_SCENARIOS``. A success
answers ``served-by kind=<bearer|x-api-key> fp=<sha256-12>``; with
``api.headroom(token, Headroom(five_hour=0.91, seven_day=0.35))`` its 200s also carry
the unified rate-limit headers, from which the CLI reports a ``rate_limit_event``
on the successful turn. ``api.gateway_url`` is the same API under ``/gateway``, so a
test can tell a gateway's requests from the provider's.

Only fingerprints are ever stored: ``api.requests`` holds no raw credential.

    with MessagesApiStandIn() as api:
        env = api.cli_env(home=tmp_path, CLAUDE_CODE_OAUTH_TOKEN="sk-ant-oat01-good-aaaa")
        ...  # run the CLI
        assert api.requests[0].fingerprint == fingerprint("sk-ant-oat01-good-aaaa")
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import json
import os
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import SecretRegistry
from tests.support.real_clis import CLAUDE
from tests.support.thread_server import ThreadServer

UNKNOWN_MODEL = "claude-nonexistent-9"
QUIET_CLI = {
    "CLAUDE_CODE_MAX_RETRIES": "0",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}
"""The real CLI with no retries and no traffic but the turn's."""
REQUEST_ID = "req_mock"  # what the reference fixtures show
GATEWAY_PREFIX = "/gateway"
INSTALLED_CLI = CLAUDE.installed
"""Where `make test` installs the pinned CLI."""


USAGE = {"input_tokens": 10, "cache_read_input_tokens": 1200, "cache_creation_input_tokens": 300}
"""What every successful call reports: a prompt mostly read from the prompt cache."""


def fingerprint(value: str) -> str:
    """Return the first 12 hex digits of the sha256 of ``value`` (the fixtures' ``fp``)."""
    return hashlib.sha256(value.encode()).hexdigest()[:12]


class Scenario(enum.StrEnum):
    """What the stand-in answers to one ``POST /v1/messages``."""

    SUCCESS = "success"
    RATE_LIMIT_FIVE_HOUR = "rate_limit_five_hour"  # subscription 5-hour window, 429
    RATE_LIMIT_SEVEN_DAY = "rate_limit_seven_day"  # subscription weekly window, 429
    RATE_LIMIT_API_KEY = "rate_limit_api_key"  # classic per-key rate limit, 429
    AUTH_401 = "auth_401"
    BILLING = "billing"  # 400, credit balance too low
    OVERLOADED = "overloaded"  # 529
    SERVER_ERROR = "server_error"  # 500
    MODEL_NOT_FOUND = "model_not_found"  # 404
    SLOW = "slow"  # success once api.release() is called (or slow_max_wait_s passes)
    BASH_TOOL = "bash_tool"  # asks for one Bash call (TOOL_COMMAND), then a success


# Substring of the credential -> scenario, checked in this order.
DEFAULT_SUBSTRING_SCENARIOS: tuple[tuple[str, Scenario], ...] = (
    ("ratelimit", Scenario.RATE_LIMIT_FIVE_HOUR),
    ("weekly", Scenario.RATE_LIMIT_SEVEN_DAY),
    ("badauth", Scenario.AUTH_401),
    ("nocredit", Scenario.BILLING),
    ("overloaded", Scenario.OVERLOADED),
    ("servererror", Scenario.SERVER_ERROR),
    ("slow", Scenario.SLOW),
    ("bashtool", Scenario.BASH_TOOL),
)

TOOL_COMMAND = (
    "env; for e in /proc/[0-9]*/environ; do "
    "if { tr '\\0' '\\n' < \"$e\"; } 2>/dev/null | grep -q '^TRINITY_EXECUTION_ID='; "
    "then echo \"== $e\"; { tr '\\0' '\\n' < \"$e\"; } 2>/dev/null; fi; done"
)
"""What a BASH_TOOL turn's tool runs: its own environment, then that of every process of
the turn it can read (the CLI's among them: each carries the turn's tag)."""


class ScenarioCredentials:
    """Fresh credential values that pick a scenario by substring (``ratelimit`` …), each
    registered for the leak checks under ``label``."""

    def __init__(self, registry: SecretRegistry, label: str = "cli") -> None:
        self.registry = registry
        self.label = label
        self.values: list[str] = []

    def new(self, scenario: str) -> str:
        """A new value holding ``scenario`` (a substring, or none for a success)."""
        value = f"tsec{scenario}{secrets.token_hex(10)}"
        self.values.append(value)
        return self.registry.add(f"{self.label}-{scenario}", value)


@dataclass(frozen=True)
class RecordedRequest:
    """One request the stand-in received; credentials appear only as fingerprints."""

    method: str
    path: str
    model: str | None
    stream: bool | None
    credential_kind: str  # "bearer", "x-api-key", or "none"
    fingerprint: str | None  # of the credential that chose the scenario
    fingerprints: Mapping[str, str]  # every credential header sent: kind -> fingerprint
    scenario: str
    session_id: str | None  # the CLI's X-Claude-Code-Session-Id header
    received_at: float
    images: tuple[tuple[str, str], ...] = ()  # (media type, fingerprint of the base64 data)


@dataclass(frozen=True)
class _Credential:
    kind: str
    value: str | None
    fingerprints: dict[str, str]


def _credential_of(request: Request) -> _Credential:
    """Return the credential of ``request``: ``x-api-key`` wins when both headers are sent."""
    api_key = request.headers.get("x-api-key")
    authorization = request.headers.get("authorization", "")
    bearer = authorization[7:].strip() if authorization.lower().startswith("bearer ") else None
    fingerprints: dict[str, str] = {}
    if api_key:
        fingerprints["x-api-key"] = fingerprint(api_key)
    if bearer:
        fingerprints["bearer"] = fingerprint(bearer)
    if api_key:
        return _Credential("x-api-key", api_key, fingerprints)
    if bearer:
        return _Credential("bearer", bearer, fingerprints)
    return _Credential("none", None, fingerprints)


def _error(
    status: int, error_type: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    """Answer in the real API's error shape."""
    body = {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": REQUEST_ID,
    }
    return JSONResponse(body, status, headers={"request-id": REQUEST_ID, **(headers or {})})


def unified_rate_limit_headers(window: str, resets_at: int) -> dict[str, str]:
    """Return the subscription ("unified") rate-limit headers of a rejected request.

    ``window`` is ``five_hour`` or ``seven_day``. The CLI turns these into a
    ``rate_limit_event`` with ``rateLimitType`` = the representative claim and
    ``resetsAt`` = the reset header.
    """
    short = {"five_hour": "5h", "seven_day": "7d"}[window]
    return {
        "anthropic-ratelimit-unified-status": "rejected",
        "anthropic-ratelimit-unified-reset": str(resets_at),
        "anthropic-ratelimit-unified-representative-claim": window,
        f"anthropic-ratelimit-unified-{short}-status": "rejected",
        f"anthropic-ratelimit-unified-{short}-reset": str(resets_at),
        f"anthropic-ratelimit-unified-{short}-utilization": "1.0",
        "retry-after": str(max(0, resets_at - int(time.time()))),
    }


KEY_RETRY_AFTER_S = 30
"""An API key's 429 is a per-minute limit's: its `retry-after` is seconds, never the
subscription windows' hours (the broker believes it, contract §7)."""


def api_key_rate_limit_headers() -> dict[str, str]:
    """Return the classic per-key rate-limit headers of a rejected API-key request."""
    reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + KEY_RETRY_AFTER_S))
    return {
        "retry-after": str(KEY_RETRY_AFTER_S),
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": reset,
        "anthropic-ratelimit-input-tokens-limit": "30000",
        "anthropic-ratelimit-input-tokens-remaining": "30000",
        "anthropic-ratelimit-input-tokens-reset": reset,
    }


def _sse(text: str, model: str) -> Iterator[bytes]:
    """Yield the server-sent events of a one-block text message."""
    delta = {"type": "text_delta", "text": text}
    return _sse_block({"type": "text", "text": ""}, delta, "end_turn", model)


def _sse_tool_use(command: str, model: str) -> Iterator[bytes]:
    """Yield the server-sent events of a message that asks for one Bash call."""
    block = {"type": "tool_use", "id": "toolu_mock", "name": "Bash", "input": {}}
    delta = {"type": "input_json_delta", "partial_json": json.dumps({"command": command})}
    return _sse_block(block, delta, "tool_use", model)


def _sse_block(
    block: dict[str, Any], delta: dict[str, Any], stop_reason: str, model: str
) -> Iterator[bytes]:
    """Yield the server-sent events of a one-block message."""
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_mock",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": dict(USAGE, output_tokens=1),
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]
    for event in events:
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


@dataclass(frozen=True)
class Headroom:
    """A subscription's use of its two windows, sent as the unified headers of its 200s."""

    five_hour: float
    seven_day: float
    five_hour_reset_in_s: int = 3600
    seven_day_reset_in_s: int = 4 * 86400
    warning_at: float = 0.75
    """A window used past this reads `allowed_warning` (the CLI needs the threshold too)."""

    def headers(self, now: int) -> dict[str, str]:
        """The unified headers of a 200 (what the real API sends a subscription)."""
        windows = {
            "five_hour": ("5h", self.five_hour, now + self.five_hour_reset_in_s),
            "seven_day": ("7d", self.seven_day, now + self.seven_day_reset_in_s),
        }
        headers: dict[str, str] = {}
        for short, used, reset in windows.values():
            warned = used >= self.warning_at
            headers[f"anthropic-ratelimit-unified-{short}-utilization"] = str(used)
            headers[f"anthropic-ratelimit-unified-{short}-reset"] = str(reset)
            headers[f"anthropic-ratelimit-unified-{short}-status"] = (
                "allowed_warning" if warned else "allowed"
            )
            if warned:
                headers[f"anthropic-ratelimit-unified-{short}-surpassed-threshold"] = str(
                    self.warning_at
                )
        claim = max(windows, key=lambda name: windows[name][1])
        fuller = windows[claim]
        headers["anthropic-ratelimit-unified-status"] = (
            "allowed_warning" if fuller[1] >= self.warning_at else "allowed"
        )
        headers["anthropic-ratelimit-unified-reset"] = str(fuller[2])
        headers["anthropic-ratelimit-unified-representative-claim"] = claim
        return headers


class MessagesApiStandIn(ThreadServer):
    """The stand-in server: starlette app served by uvicorn in a background thread.

    ``reset_in_s`` sets how far in the future rate-limit resets lie.
    ``slow_max_wait_s`` bounds how long a ``SLOW`` request waits for ``release()``.
    """

    def __init__(self, *, reset_in_s: int = 3600, slow_max_wait_s: float = 30.0) -> None:
        self.reset_in_s = reset_in_s
        self.slow_max_wait_s = slow_max_wait_s
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._scenarios: dict[str, Scenario] = {}
        self._headroom: dict[str, Headroom] = {}
        self._reset_in: dict[str, int] = {}
        self._tool_outputs: list[str] = []
        self._released = threading.Event()
        app = Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
                Route(f"{GATEWAY_PREFIX}/v1/messages", self._messages, methods=["POST"]),
                Route("/{path:path}", self._unknown, methods=["GET", "POST", "HEAD", "PUT"]),
            ]
        )
        super().__init__(app, "messages-api")

    # -- programming the outcomes ------------------------------------------------

    def on(self, credential: str, scenario: Scenario | str) -> None:
        """Answer every request carrying ``credential`` with ``scenario``."""
        with self._lock:
            self._scenarios[credential] = Scenario(scenario)

    def headroom(self, credential: str, headroom: Headroom | None) -> None:
        """Send ``headroom``'s unified headers on the 200s to ``credential`` (None: stop)."""
        with self._lock:
            if headroom is None:
                self._headroom.pop(credential, None)
            else:
                self._headroom[credential] = headroom

    def reset_in(self, credential: str, seconds: int) -> None:
        """Rate limits of ``credential`` reset ``seconds`` after their answer."""
        with self._lock:
            self._reset_in[credential] = seconds

    @property
    def gateway_url(self) -> str:
        """The base URL of the same API as a gateway would serve it (under a path)."""
        return self.base_url + GATEWAY_PREFIX

    def release(self) -> None:
        """Let every waiting (and future) ``SLOW`` request answer."""
        self._released.set()

    def hold(self) -> None:
        """Make ``SLOW`` requests wait again (undo ``release()``)."""
        self._released.clear()

    def scenario_for(self, credential: str | None) -> Scenario:
        """Return the scenario of ``credential``: registry, then substrings, then success."""
        if credential is None:
            return Scenario.AUTH_401
        with self._lock:
            chosen = self._scenarios.get(credential)
        if chosen is not None:
            return chosen
        lowered = credential.lower()
        for needle, scenario in DEFAULT_SUBSTRING_SCENARIOS:
            if needle in lowered:
                return scenario
        return Scenario.SUCCESS

    # -- what was received -------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of the requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def message_requests(self) -> list[RecordedRequest]:
        """The ``POST /v1/messages`` requests received so far (the gateway's too)."""
        return [r for r in self.requests if r.path.endswith("/v1/messages")]

    @property
    def tool_outputs(self) -> list[str]:
        """What the BASH_TOOL turns' tool printed, as the CLI sent it back (raw: a test
        looks for credentials in it, and must not print it)."""
        with self._lock:
            return list(self._tool_outputs)

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """Block until ``count`` message requests arrived; raise ``TimeoutError`` otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            received = self.message_requests
            if len(received) >= count:
                return received
            time.sleep(0.01)
        msg = f"stand-in got {len(self.message_requests)} message requests, wanted {count}"
        raise TimeoutError(msg)

    def _record(
        self,
        request: Request,
        model: str | None,
        stream: bool | None,
        credential: _Credential,
        scenario: str,
        images: tuple[tuple[str, str], ...] = (),
    ) -> None:
        recorded = RecordedRequest(
            method=request.method,
            path=request.url.path,
            model=model,
            stream=stream,
            credential_kind=credential.kind,
            fingerprint=fingerprint(credential.value) if credential.value else None,
            fingerprints=dict(credential.fingerprints),
            scenario=scenario,
            session_id=request.headers.get("x-claude-code-session-id"),
            received_at=time.time(),
            images=images,
        )
        with self._lock:
            self._requests.append(recorded)

    # -- the routes --------------------------------------------------------------

    async def _messages(self, request: Request) -> Response:
        credential = _credential_of(request)
        try:
            body = await request.json()
        except ValueError:
            body = {}
        model = body.get("model") if isinstance(body, dict) else None
        stream = body.get("stream") if isinstance(body, dict) else None
        scenario = self.scenario_for(credential.value)
        if scenario in (Scenario.SUCCESS, Scenario.SLOW) and model == UNKNOWN_MODEL:
            scenario = Scenario.MODEL_NOT_FOUND
        if scenario is Scenario.RATE_LIMIT_FIVE_HOUR and credential.kind == "x-api-key":
            scenario = Scenario.RATE_LIMIT_API_KEY  # an API key has no subscription window
        self._record(request, model, stream, credential, scenario, _images(body))
        if scenario is Scenario.SLOW:
            await self._wait_released()
        if scenario is Scenario.BASH_TOOL:
            output = _tool_result(body)
            if output is None:
                return StreamingResponse(
                    _sse_tool_use(TOOL_COMMAND, str(model)), media_type="text/event-stream"
                )
            with self._lock:
                self._tool_outputs.append(output)
        return self._answer(scenario, credential, str(model), bool(stream))

    async def _wait_released(self) -> None:
        # Poll instead of blocking the event loop on the threading.Event.
        deadline = time.monotonic() + self.slow_max_wait_s
        while not self._released.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def _answer(
        self, scenario: Scenario, credential: _Credential, model: str, stream: bool
    ) -> Response:
        with self._lock:
            reset_in = self._reset_in.get(credential.value or "", self.reset_in_s)
        resets_at = int(time.time()) + reset_in
        match scenario:
            case Scenario.SUCCESS | Scenario.SLOW | Scenario.BASH_TOOL:
                fp = fingerprint(credential.value or "")
                text = f"served-by kind={credential.kind} fp={fp}"
                headers = {"request-id": REQUEST_ID, **self._headroom_headers(credential)}
                if not stream:
                    return JSONResponse(_message_body(text, model), headers=headers)
                return StreamingResponse(
                    _sse(text, model), media_type="text/event-stream", headers=headers
                )
            case Scenario.RATE_LIMIT_FIVE_HOUR | Scenario.RATE_LIMIT_SEVEN_DAY:
                window = "five_hour" if scenario is Scenario.RATE_LIMIT_FIVE_HOUR else "seven_day"
                return _error(
                    429,
                    "rate_limit_error",
                    "This request would exceed your account's rate limit. Please try again later.",
                    unified_rate_limit_headers(window, resets_at),
                )
            case Scenario.RATE_LIMIT_API_KEY:
                return _error(
                    429,
                    "rate_limit_error",
                    "This request would exceed the rate limit for your organization of 50 "
                    "requests per minute. Please try again later.",
                    api_key_rate_limit_headers(),
                )
            case Scenario.AUTH_401:
                bearer = credential.kind != "x-api-key"
                reason = "Invalid bearer token" if bearer else "invalid x-api-key"
                return _error(401, "authentication_error", reason)
            case Scenario.BILLING:
                return _error(
                    400,
                    "invalid_request_error",
                    "Your credit balance is too low to access the Anthropic API. "
                    "Please go to Plans & Billing to upgrade or purchase credits.",
                )
            case Scenario.OVERLOADED:
                return _error(529, "overloaded_error", "Overloaded")
            case Scenario.SERVER_ERROR:
                return _error(500, "api_error", "Internal server error")
            case Scenario.MODEL_NOT_FOUND:
                return _error(404, "not_found_error", f"model: {model}")

    def _headroom_headers(self, credential: _Credential) -> dict[str, str]:
        with self._lock:
            headroom = self._headroom.get(credential.value or "")
        return headroom.headers(int(time.time())) if headroom else {}

    async def _count_tokens(self, request: Request) -> Response:
        credential = _credential_of(request)
        self._record(request, None, None, credential, "count_tokens")
        return JSONResponse({"input_tokens": 10})

    async def _unknown(self, request: Request) -> Response:
        self._record(request, None, None, _credential_of(request), "unknown_route")
        return _error(404, "not_found_error", f"Not found: {request.url.path}")

    # -- lifecycle ---------------------------------------------------------------

    def stop(self) -> None:
        """Release slow requests, stop the server and join its thread."""
        self.release()
        super().stop()

    # -- running the real CLI against it -----------------------------------------

    def cli_env(self, home: Path, **credentials: str) -> dict[str, str]:
        """Return a minimal environment for the real CLI, pointed at this stand-in.

        ``home`` should be a fresh directory per test; ``credentials`` are added as is
        (e.g. ``CLAUDE_CODE_OAUTH_TOKEN="sk-ant-oat01-good-aaaa"``).
        """
        return cli_env(self.base_url, home, **credentials)


def _tool_result(body: object) -> str | None:
    """The text of the last message's tool result, or None when it carries none."""
    messages = body.get("messages") if isinstance(body, dict) else None
    last = messages[-1] if isinstance(messages, list) and messages else None
    content = last.get("content") if isinstance(last, dict) else None
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            inner = block.get("content")
            if isinstance(inner, list):
                return "".join(str(b.get("text", "")) for b in inner if isinstance(b, dict))
            return str(inner)
    return None


def _images(body: object) -> tuple[tuple[str, str], ...]:
    """Every base64 image block in a request's messages: (media type, data fingerprint)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    found = []
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            source = block.get("source") if isinstance(block, dict) else None
            if block.get("type") == "image" and isinstance(source, dict):
                found.append((str(source.get("media_type")), fingerprint(str(source.get("data")))))
    return tuple(found)


def _message_body(text: str, model: str) -> dict[str, Any]:
    """Return a non-streaming Messages API reply."""
    return {
        "id": "msg_mock",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": dict(USAGE, output_tokens=5),
    }


def cli_env(base_url: str, home: Path, **extra: str) -> dict[str, str]:
    """Return the environment that runs the real CLI quietly against ``base_url``."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        **QUIET_CLI,
    }
    if os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"  # else the CLI refuses bypassPermissions as root
    env.update(extra)
    return env


def require_real_cli() -> Path:
    """The real Claude Code CLI for a ``realcli`` test: fails under CI when missing, else
    skips (``real_clis.CLAUDE``)."""
    return CLAUDE.require()


@pytest.fixture(name="messages_api")
def messages_api_fixture() -> Iterator[MessagesApiStandIn]:
    """A started stand-in, stopped after the test (import this fixture into a test module)."""
    with MessagesApiStandIn() as api:
        yield api


@pytest.fixture(name="real_cli")
def real_cli_fixture() -> Path:
    """The real CLI's path, per ``require_real_cli``."""
    return require_real_cli()


def real_cli_path() -> Path | None:
    """The real Claude Code CLI: ``AGENT_SERVER_TEST_CLAUDE_BIN``, else `make test`'s copy."""
    return CLAUDE.path()

"""The broker stands in for an OpenAI or a Gemini key: placement, the key's header, the
refusal's verdict from each API's error body."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from pydantic import SecretStr

from agent_server.broker import Broker, Exchange, Grant, verdict_of
from agent_server.broker.error_body import read_error
from agent_server.broker.placement import placement, rung_of
from agent_server.broker.providers import PROVIDERS
from agent_server.wire.names import Api, Layer, OutcomeKind
from agent_server.wire.turns import AuthOverride
from tests.support.recording_upstream import RecordingUpstream
from tests.unit.broker.test_broker import REAL, run_with_broker, upstream_fixture  # noqa: F401 - the fixture

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
BROKER = "http://127.0.0.1:1"


def _issue(grant: Grant, shape: str) -> str:
    return f"{shape}placeholder"


def _place(env: dict[str, str], api: Api, sources: dict[str, Layer] | None = None) -> object:
    return placement(env, sources or dict.fromkeys(env, "baseline"), BROKER, _issue, api)


@pytest.mark.parametrize(
    ("case", "api", "env", "variable", "header", "upstream"),
    [
        (
            "an OpenAI key goes to the API by default",
            "openai",
            {"OPENAI_API_KEY": "sk-real"},
            "OPENAI_API_KEY",
            "authorization",
            "https://api.openai.com/v1",
        ),
        (
            "a Codex key is read where Codex's brokered provider reads",
            "openai",
            {"CODEX_API_KEY": "sk-real", "OPENAI_BASE_URL": "https://proxy.example/v1/"},
            "OPENAI_API_KEY",
            "authorization",
            "https://proxy.example/v1",
        ),
        (
            "a Gemini key goes to its base URL",
            "gemini",
            {"GEMINI_API_KEY": "AIza-real", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9"},
            "GEMINI_API_KEY",
            "x-goog-api-key",
            "http://127.0.0.1:9",
        ),
        (
            "a Google key is placed as the Gemini key",
            "gemini",
            {"GOOGLE_API_KEY": "AIza-real"},
            "GEMINI_API_KEY",
            "x-goog-api-key",
            "https://generativelanguage.googleapis.com",
        ),
    ],
)
def test_a_key_apis_placement(
    case: str, api: Api, env: dict[str, str], variable: str, header: str, upstream: str
) -> None:
    """The placeholder (of the key's shape) under the variable the CLI reads first, the
    broker as the base URL, no real key left; the grant keeps the key and its route."""
    placed = placement(env, dict.fromkeys(env, "baseline"), BROKER, _issue, api)
    assert placed is not None, case
    assert placed.env[variable] == f"{PROVIDERS[api].key_shape}placeholder"
    assert "sk-real" not in placed.env.values() and "AIza-real" not in placed.env.values()
    base = "OPENAI_BASE_URL" if api == "openai" else "GOOGLE_GEMINI_BASE_URL"
    assert placed.env[base] == BROKER
    assert (placed.grant.header, placed.grant.upstream) == (header, upstream)


@pytest.mark.parametrize(
    ("case", "api", "env"),
    [
        ("no key at all (a login of the CLI's own)", "openai", {"HOME": "/root"}),
        (
            "Vertex AI, which the CLI signs for itself",
            "gemini",
            {
                "GEMINI_API_KEY": "k",
                "GOOGLE_GENAI_USE_VERTEXAI": "true",
            },
        ),
        ("a Google login", "gemini", {"GOOGLE_GENAI_USE_GCA": "true", "GEMINI_API_KEY": "k"}),
    ],
)
def test_a_key_api_placement_leaves_out_what_the_broker_cannot_hold(
    case: str, api: Api, env: dict[str, str]
) -> None:
    """None: the spawn runs outside the broker."""
    assert _place(env, api) is None, case


def test_a_base_url_of_dotenv_never_routes_the_servers_key() -> None:
    """The agent's `.env` base URL is not where the server's key goes (§4.6)."""
    env = {"OPENAI_API_KEY": "sk-real", "OPENAI_BASE_URL": "https://agent.example"}
    placed = placement(
        env,
        {"OPENAI_API_KEY": "baseline", "OPENAI_BASE_URL": "env_file"},
        BROKER,
        _issue,
        "openai",
    )
    assert placed is not None
    assert placed.grant.upstream == "https://api.openai.com/v1"


@pytest.mark.parametrize(
    ("api", "override", "header", "upstream"),
    [
        ("openai", AuthOverride(api_key="k"), "authorization", "https://up"),
        ("gemini", AuthOverride(api_key="k"), "x-goog-api-key", "https://up"),
        (
            "gemini",
            AuthOverride.model_validate(
                {"provider": {"base_url": "https://gw/", "auth_token": "k"}}
            ),
            "x-goog-api-key",
            "https://gw",
        ),
        ("anthropic", AuthOverride(api_key="k"), "x-api-key", "https://up"),
    ],
)
def test_a_ladder_rung_of_each_api(
    api: Api, override: AuthOverride, header: str, upstream: str
) -> None:
    """A key rung travels in its API's key header; a provider's to its own URL."""
    rung = rung_of(override, "https://up", api)
    assert (rung.header, rung.upstream) == (header, upstream)


def test_a_gemini_key_goes_in_x_goog_api_key_and_a_query_placeholder_leaves_the_url(
    upstream: RecordingUpstream,
) -> None:
    """Presented in `x-goog-api-key` or `?key=`, the placeholder becomes the key in the
    grant's header; the query keeps every other parameter."""

    async def test(broker: Broker, client: httpx.AsyncClient) -> None:
        gemini = Grant("x-goog-api-key", SecretStr(REAL), upstream.base_url)
        placeholder = broker.grants.issue(gemini, "AIza")
        path = "/v1beta/models/m:streamGenerateContent"
        await client.post(f"{path}?alt=sse", headers={"x-goog-api-key": placeholder})
        await client.post(f"{path}?alt=sse&key={placeholder}")

    run_with_broker(test)
    for got in upstream.received:
        headers = dict(got.headers)
        assert headers["x-goog-api-key"] == REAL
        assert got.query == "alt=sse"
        assert "authorization" not in headers


def _refused(status: int, body: dict[str, object]) -> Exchange:
    exchange = Exchange(status)
    exchange.read_error_body(json.dumps(body).encode())
    return exchange


def _openai(code: str, kind: str = "invalid_request_error") -> dict[str, object]:
    return {"error": {"message": "m", "type": kind, "param": None, "code": code}}


def _google(status: str, reason: str | None = None) -> dict[str, object]:
    details = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason}]
    return {"error": {"code": 400, "message": "m", "status": status, "details": details}}


@pytest.mark.parametrize(
    ("case", "answer", "kind"),
    [
        (
            "OpenAI's rate limit",
            _refused(429, _openai("rate_limit_exceeded", "requests")),
            OutcomeKind.RATE_LIMIT,
        ),
        (
            "OpenAI's exhausted credit is billing, not a rate limit",
            _refused(429, _openai("insufficient_quota", "insufficient_quota")),
            OutcomeKind.BILLING,
        ),
        ("OpenAI's bad key", _refused(401, _openai("invalid_api_key")), OutcomeKind.AUTH),
        (
            "OpenAI's unknown model",
            _refused(404, _openai("model_not_found")),
            OutcomeKind.MODEL_UNSUPPORTED,
        ),
        (
            "OpenAI's overload",
            _refused(503, _openai("server_error", "server_error")),
            OutcomeKind.UPSTREAM_UNAVAILABLE,
        ),
        (
            "Gemini's exhausted quota",
            _refused(429, _google("RESOURCE_EXHAUSTED")),
            OutcomeKind.RATE_LIMIT,
        ),
        (
            "Gemini's invalid key is auth",
            _refused(400, _google("INVALID_ARGUMENT", "API_KEY_INVALID")),
            OutcomeKind.AUTH,
        ),
        (
            "Gemini's denied permission",
            _refused(403, _google("PERMISSION_DENIED")),
            OutcomeKind.AUTH,
        ),
        (
            "Gemini's unavailable",
            _refused(503, _google("UNAVAILABLE")),
            OutcomeKind.UPSTREAM_UNAVAILABLE,
        ),
        (
            "Gemini's other bad request names no row",
            _refused(400, _google("INVALID_ARGUMENT")),
            None,
        ),
    ],
)
def test_each_apis_refusal_names_its_row(
    case: str, answer: Exchange, kind: OutcomeKind | None
) -> None:
    """The API's own words in the body decide the row, whichever API it is."""
    assert verdict_of(answer, NOW).kind is kind, case


@pytest.mark.parametrize(
    ("case", "body", "resets_in"),
    [
        (
            "Gemini's RetryInfo",
            {
                "error": {
                    "code": 429,
                    "status": "RESOURCE_EXHAUSTED",
                    "details": [
                        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3600s"}
                    ],
                }
            },
            timedelta(hours=1),
        ),
        (
            "OpenAI's usage limit",
            {"error": {"type": "usage_limit_reached", "resets_in_seconds": 7200}},
            timedelta(hours=2),
        ),
        (
            "a delay past any window is not believed",
            {"error": {"type": "usage_limit_reached", "resets_in_seconds": 74 * 365 * 86400}},
            None,
        ),
    ],
)
def test_a_rate_limits_reset_from_its_body(
    case: str, body: dict[str, object], resets_in: timedelta | None
) -> None:
    """With no reset header, the body's own retry delay is the reset, bounded as any."""
    verdict = verdict_of(_refused(429, body), NOW)
    assert verdict.kind is OutcomeKind.RATE_LIMIT
    expected = NOW + resets_in if resets_in is not None else None
    assert verdict.resets_at == expected, case


@pytest.mark.parametrize(
    ("case", "body"),
    [
        ("not JSON", b"<html>"),
        ("no error object", b'{"error": "nope"}'),
        ("a list", b"[1, 2]"),
    ],
)
def test_a_body_that_is_no_error_object_says_nothing(case: str, body: bytes) -> None:
    """None: the verdict goes by the status alone."""
    assert read_error(body) is None, case


def test_an_error_bodys_facts_are_bounded() -> None:
    """Each word at most 64 characters, the message 500; a negative delay is none."""
    body = {"error": {"code": "x" * 999, "message": "m" * 999, "resets_in_seconds": -5}}
    error = read_error(json.dumps(body).encode())
    assert error is not None
    assert (len(error.code or ""), len(error.message or ""), error.retry_after_s) == (64, 500, None)

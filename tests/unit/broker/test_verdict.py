"""The exchange's verdict and reading, and the broker's placement of a spawn's credential."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent_server.broker import Exchange, Grant, rate_limit_info, verdict_of
from agent_server.broker.placement import DEFAULT_UPSTREAM, placement
from agent_server.runtimes.rate_limit import read_rate_limit
from agent_server.wire.names import OutcomeKind

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
EPOCH = int(NOW.timestamp())
P = "anthropic-ratelimit-unified-"


def exchange(
    status: int | None, error_type: str | None = None, message: str = "", **headers: str
) -> Exchange:
    return Exchange(
        status,
        {k.replace("_", "-"): v for k, v in headers.items()},
        error_type,
        message,
    )


@pytest.mark.parametrize(
    ("case", "answer", "kind"),
    [
        ("a success names no row", exchange(200), None),
        ("a 429 is a rate limit", exchange(429, "rate_limit_error"), OutcomeKind.RATE_LIMIT),
        ("a 401 is auth", exchange(401, "authentication_error"), OutcomeKind.AUTH),
        ("a 403 is auth", exchange(403, "permission_error"), OutcomeKind.AUTH),
        ("a 402 is billing", exchange(402), OutcomeKind.BILLING),
        (
            "a 400 on the credit balance is billing",
            exchange(400, "invalid_request_error", "Your credit balance is too low"),
            OutcomeKind.BILLING,
        ),
        (
            "a 404 on the model is a model rejection",
            exchange(404, "not_found_error", "model: x"),
            OutcomeKind.MODEL_UNSUPPORTED,
        ),
        (
            "a 404 on a path (a wrong base URL) is no model's",
            exchange(404, "not_found", "Not found: /responses"),
            None,
        ),
        (
            "a 529 is the upstream's",
            exchange(529, "overloaded_error"),
            OutcomeKind.UPSTREAM_UNAVAILABLE,
        ),
        ("a 500 is the upstream's", exchange(500, "api_error"), OutcomeKind.UPSTREAM_UNAVAILABLE),
        ("no answer at all is the upstream's", exchange(None), OutcomeKind.UPSTREAM_UNAVAILABLE),
        ("any other 400 names no row", exchange(400, "invalid_request_error", "bad"), None),
    ],
)
def test_the_verdict_of_an_answer(case: str, answer: Exchange, kind: OutcomeKind | None) -> None:
    """Each status (and error type) of the API names its row of the outcome table."""
    assert verdict_of(answer, NOW).kind is kind, case


@pytest.mark.parametrize(
    ("case", "window", "reset_in", "believed"),
    [
        ("a five-hour reset within five hours", "five_hour", timedelta(hours=4), True),
        (
            "a five-hour reset a minute past its reach",
            "five_hour",
            timedelta(hours=5, minutes=2),
            False,
        ),
        ("a weekly reset within a week", "seven_day", timedelta(days=6), True),
        ("a reset in the year 2100", "seven_day", timedelta(days=365 * 74), False),
        ("a reset already past", "five_hour", timedelta(hours=-1), False),
        ("an unknown window's reset within a week", None, timedelta(days=2), True),
    ],
)
def test_a_reset_past_its_window_is_not_believed(
    case: str, window: str | None, reset_in: timedelta, believed: bool
) -> None:
    """The unified reset is the rate limit's, bounded by what its window can reach."""
    headers = {f"{P}reset": str(EPOCH + int(reset_in.total_seconds()))}
    if window is not None:
        headers[f"{P}representative-claim"] = window
    verdict = verdict_of(Exchange(429, headers), NOW)
    assert verdict.kind is OutcomeKind.RATE_LIMIT
    assert verdict.rate_limit_type == window
    expected = NOW + reset_in if believed else None
    assert verdict.resets_at == expected, case


def test_an_api_keys_429_resets_after_its_retry_after() -> None:
    """Without the unified headers, `retry-after` gives the reset."""
    verdict = verdict_of(Exchange(429, {"retry-after": "30"}), NOW)
    assert verdict.resets_at == NOW + timedelta(seconds=30)
    assert verdict.rate_limit_type is None


def test_the_unified_headers_read_as_the_clis_rate_limit_info() -> None:
    """A 200's headers give both windows, read by the one reader of that shape."""
    headers = {
        f"{P}status": "allowed_warning",
        f"{P}reset": str(EPOCH + 3600),
        f"{P}representative-claim": "five_hour",
        f"{P}5h-utilization": "0.91",
        f"{P}5h-reset": str(EPOCH + 3600),
        f"{P}5h-status": "allowed_warning",
        f"{P}5h-surpassed-threshold": "0.75",
        f"{P}7d-utilization": "0.35",
        f"{P}7d-reset": str(EPOCH + 4 * 86400),
        f"{P}7d-status": "allowed",
    }
    reading = read_rate_limit(rate_limit_info(headers))
    assert reading is not None
    assert reading.status == "allowed_warning"
    assert reading.rate_limit_type == "five_hour"
    assert reading.utilization == 0.91
    assert reading.surpassed_threshold == 0.75
    assert reading.five_hour is not None and reading.five_hour.utilization == 0.91
    assert reading.seven_day is not None and reading.seven_day.status == "allowed"
    assert reading.seven_day.resets_at == "2026-12-09T12:00:00Z"


def test_an_answer_without_unified_headers_has_no_reading() -> None:
    """An API key's answers carry none: no reading, never an invented one."""
    assert rate_limit_info({"retry-after": "3"}) is None


def _issue(grant: Grant, shape: str) -> str:
    return f"{shape}placeholder"


@pytest.mark.parametrize(
    ("case", "env", "variable", "header", "upstream"),
    [
        (
            "a subscription keeps OAuth mode, to the default API",
            {"CLAUDE_CODE_OAUTH_TOKEN": "oauth"},
            "CLAUDE_CODE_OAUTH_TOKEN",
            "authorization",
            DEFAULT_UPSTREAM,
        ),
        (
            "an API key stays a key, and the token it shadows goes",
            {"ANTHROPIC_API_KEY": "key", "CLAUDE_CODE_OAUTH_TOKEN": "oauth"},
            "ANTHROPIC_API_KEY",
            "x-api-key",
            DEFAULT_UPSTREAM,
        ),
        (
            "a gateway's token goes to the gateway",
            {"ANTHROPIC_AUTH_TOKEN": "gw", "ANTHROPIC_BASE_URL": "https://gw.example/api/"},
            "ANTHROPIC_AUTH_TOKEN",
            "authorization",
            "https://gw.example/api",
        ),
    ],
)
def test_placement_keeps_the_clis_credential_mode(
    case: str, env: dict[str, str], variable: str, header: str, upstream: str
) -> None:
    """The same variable holds a placeholder; the broker keeps the credential and its route."""
    placed = placement(env, dict.fromkeys(env, "baseline"), "http://127.0.0.1:1", _issue)
    assert placed is not None, case
    assert placed.env[variable].endswith("placeholder")
    assert placed.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:1"
    assert set(env.values()).isdisjoint(placed.env.values()), case
    assert placed.grant.secret.get_secret_value() == env[variable]
    assert (placed.grant.header, placed.grant.upstream) == (header, upstream)


@pytest.mark.parametrize(
    ("case", "env"),
    [
        ("no credential of the server's", {"PATH": "/bin"}),
        (
            "a cloud provider the CLI signs for",
            {"CLAUDE_CODE_USE_BEDROCK": "1", "ANTHROPIC_API_KEY": "k"},
        ),
    ],
)
def test_placement_leaves_out_what_the_broker_cannot_hold(case: str, env: dict[str, str]) -> None:
    """No placement: the spawn's environment is built as without a broker."""
    assert placement(env, dict.fromkeys(env, "baseline"), "http://127.0.0.1:1", _issue) is None, (
        case
    )


def test_a_container_proxy_does_not_carry_the_placeholder() -> None:
    """The broker's loopback joins NO_PROXY when the container sets a proxy."""
    env = {
        "CLAUDE_CODE_OAUTH_TOKEN": "oauth",
        "HTTPS_PROXY": "http://proxy:3128",
        "NO_PROXY": "corp",
    }
    placed = placement(env, dict.fromkeys(env, "baseline"), "http://127.0.0.1:1", _issue)
    assert placed is not None
    assert placed.env["NO_PROXY"] == "corp,127.0.0.1,localhost"

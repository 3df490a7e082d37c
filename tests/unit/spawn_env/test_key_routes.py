"""Rule 1 of the route guard for a key-only API: `.env` routes only a key it set (§4.6)."""

from __future__ import annotations

import pytest

from agent_server.spawn_env.route import guard_route
from agent_server.wire.names import Layer

AGENT_HOST = "https://agent.example"


@pytest.mark.parametrize(
    ("case", "baseline", "sources", "expected"),
    [
        (
            "the server's Gemini key keeps the server's base URL",
            {"GEMINI_API_KEY": "k", "GOOGLE_GEMINI_BASE_URL": "https://api.example"},
            {"GEMINI_API_KEY": "baseline"},
            "https://api.example",
        ),
        (
            "the server's OpenAI key with no base URL of the server's goes to the default",
            {"OPENAI_API_KEY": "k"},
            {"OPENAI_API_KEY": "baseline"},
            None,
        ),
        (
            "a per-turn key is no .env key either",
            {},
            {"OPENAI_API_KEY": "per_spawn"},
            None,
        ),
        ("a key .env set goes where .env says", {}, {"OPENAI_API_KEY": "env_file"}, AGENT_HOST),
        ("with no key at all, .env's URL stays", {}, {"HOME": "baseline"}, AGENT_HOST),
    ],
)
def test_a_dotenv_base_url_routes_only_a_dotenv_key(
    case: str, baseline: dict[str, str], sources: dict[str, Layer], expected: str | None
) -> None:
    """The base URL `.env` set falls back to the baseline's, or goes, unless the key the
    CLI reads first came from `.env`."""
    (key,) = sources
    base = "GOOGLE_GEMINI_BASE_URL" if key.startswith("GEMINI") else "OPENAI_BASE_URL"
    env = {key: "k", base: AGENT_HOST} if key != "HOME" else {base: AGENT_HOST}
    all_sources: dict[str, Layer] = {**sources, base: "env_file"}
    rerouted = guard_route(baseline, env, all_sources)
    assert env.get(base) == expected, case
    assert (base in rerouted) is (expected != AGENT_HOST), case

"""Each runtime through the broker: its API, the overrides it takes, Codex's provider."""

from __future__ import annotations

import itertools
import tomllib

import pytest

from agent_server.runtimes import ADAPTERS, adapter_for
from agent_server.runtimes.base import TurnSpec, override_kinds
from agent_server.runtimes.claude_code import ClaudeCodeAdapter
from agent_server.runtimes.codex import BROKER_PROVIDER, CodexAdapter
from agent_server.wire.names import AUTH_OVERRIDE_KINDS, BYPASS_PERMISSIONS

BROKER = "http://127.0.0.1:4711"


def test_every_runtime_is_brokered_and_names_its_api() -> None:
    """Claude Code's API is Anthropic's, Codex's OpenAI's, Gemini CLI's Google's."""
    apis = {adapter.name: adapter.api for adapter in ADAPTERS}
    assert apis == {"claude-code": "anthropic", "codex": "openai", "gemini-cli": "gemini"}
    assert all(adapter.brokered for adapter in ADAPTERS)


@pytest.mark.parametrize(
    ("runtime", "brokered", "kinds"),
    [
        ("claude-code", False, AUTH_OVERRIDE_KINDS),
        ("claude-code", True, AUTH_OVERRIDE_KINDS),
        ("codex", False, ()),
        ("codex", True, ("api_key", "provider")),
        ("gemini-cli", True, ("api_key", "provider")),
    ],
)
def test_the_overrides_each_runtime_takes(
    runtime: str, brokered: bool, kinds: tuple[str, ...]
) -> None:
    """A key-only CLI takes a key or a provider per turn, and only through the broker."""
    assert override_kinds(adapter_for(runtime), brokered) == kinds


def _settings(argv: list[str]) -> dict[str, object]:
    """The `-c key=value` settings of an argv, as TOML reads them."""
    settings: dict[str, object] = {}
    for flag, value in itertools.pairwise(argv):
        if flag == "-c":
            key, _, raw = value.partition("=")
            settings[key] = tomllib.loads(f"v = {raw}")["v"]
    return settings


def test_a_brokered_codex_turn_runs_on_the_brokers_provider() -> None:
    """The provider's `-c` flags name the broker's URL and the placeholder's variable;
    they come before `resume` and the prompt's `-`."""
    spec = TurnSpec(
        prompt="hi", permission_mode=BYPASS_PERMISSIONS, api_base=BROKER, resume_session_id="s"
    )
    argv = CodexAdapter().argv("codex", spec)
    table = f"model_providers.{BROKER_PROVIDER}"
    assert _settings(argv) == {
        "model_provider": BROKER_PROVIDER,
        f"{table}.name": BROKER_PROVIDER,
        f"{table}.base_url": BROKER,
        f"{table}.env_key": "OPENAI_API_KEY",
        f"{table}.wire_api": "responses",
    }
    assert argv[-3:] == ["resume", "s", "-"]


def test_a_codex_turn_outside_the_broker_keeps_its_own_provider() -> None:
    """No `-c` of the broker's without a broker's base."""
    argv = CodexAdapter().argv("codex", TurnSpec(prompt="hi", permission_mode="default"))
    assert "-c" not in argv


@pytest.mark.parametrize(
    ("sources", "flag"),
    [(None, None), ((), ""), (("project",), "project"), (("project", "local"), "project,local")],
    ids=["unset: the CLI's default", "none of the agent's", "project", "two"],
)
def test_claude_codes_setting_sources(sources: tuple[str, ...] | None, flag: str | None) -> None:
    """`--setting-sources` only when the server restricts them, as one token after it."""
    spec = TurnSpec(prompt="hi", permission_mode=BYPASS_PERMISSIONS, setting_sources=sources)
    argv = ClaudeCodeAdapter().argv("claude", spec)
    if flag is None:
        assert "--setting-sources" not in argv
    else:
        assert argv[argv.index("--setting-sources") + 1] == flag

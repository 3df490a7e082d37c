"""Credentials on descriptors (contract §4.7): the pure split, and the pipes the runner makes."""

from __future__ import annotations

import os

import pytest

from agent_server.errors import SpawnTooLarge
from agent_server.process.pipes import descriptor_pipes
from agent_server.spawn_env.descriptors import by_descriptor
from agent_server.wire.names import CLAUDE_DESCRIPTORS

OAUTH_FD = "CLAUDE_CODE_OAUTH_TOKEN_FILE_DESCRIPTOR"
KEY_FD = "CLAUDE_CODE_API_KEY_FILE_DESCRIPTOR"


@pytest.mark.parametrize(
    ("env", "rest", "handed"),
    [
        pytest.param({"PATH": "/bin"}, {"PATH": "/bin"}, {}, id="no credential: nothing handed"),
        pytest.param(
            {"CLAUDE_CODE_OAUTH_TOKEN": "oat", "PATH": "/bin"},
            {"PATH": "/bin"},
            {OAUTH_FD: "oat"},
            id="the OAuth token leaves the environment for its descriptor",
        ),
        pytest.param(
            {"CLAUDE_CODE_OAUTH_TOKEN": "oat", "ANTHROPIC_API_KEY": "key"},
            {},
            {OAUTH_FD: "oat", KEY_FD: "key"},
            id="both go, and the CLI's own precedence picks the key",
        ),
        pytest.param(
            {"ANTHROPIC_AUTH_TOKEN": "gw", "ANTHROPIC_BASE_URL": "https://gw"},
            {"ANTHROPIC_AUTH_TOKEN": "gw", "ANTHROPIC_BASE_URL": "https://gw"},
            {},
            id="a gateway token has no descriptor the CLI honours: it stays",
        ),
        pytest.param(
            {"CLAUDE_CODE_OAUTH_TOKEN": ""},
            {},
            {},
            id="an empty value stays unset",
        ),
    ],
)
def test_by_descriptor(env: dict[str, str], rest: dict[str, str], handed: dict[str, str]) -> None:
    """What leaves the environment, and under which descriptor variable."""
    assert by_descriptor(env, CLAUDE_DESCRIPTORS) == (rest, handed)


def test_a_runtime_without_descriptors_keeps_its_environment() -> None:
    """Codex and Gemini CLI take no descriptor: their credentials stay in the environment."""
    env = {"OPENAI_API_KEY": "sk", "CLAUDE_CODE_OAUTH_TOKEN": "oat"}
    assert by_descriptor(env, {}) == (env, {})


def test_each_credential_is_a_pipe_written_once_and_closed() -> None:
    """The child reads the value and then the end; the env names the read end."""
    env: dict[str, str] = {}
    fds = descriptor_pipes({OAUTH_FD: "sk-ant-oat01-unit", KEY_FD: "sk-ant-api03-unit"}, env)
    try:
        assert sorted(env) == [KEY_FD, OAUTH_FD]
        assert sorted(int(v) for v in env.values()) == sorted(fds)
        with os.fdopen(os.dup(int(env[OAUTH_FD])), "rb") as pipe:
            assert pipe.read() == b"sk-ant-oat01-unit"  # then EOF: no writer is left
        assert all(os.get_blocking(fd) for fd in fds)
        assert not any(os.get_inheritable(fd) for fd in fds)  # only `pass_fds` hands them on
    finally:
        for fd in fds:
            os.close(fd)


def test_a_value_that_does_not_fit_a_pipe_is_refused_and_nothing_leaks() -> None:
    """Never a blocked loop: the value is refused, and every pipe made so far is closed."""
    before = set(os.listdir("/proc/self/fd"))
    env: dict[str, str] = {}
    with pytest.raises(SpawnTooLarge, match="CLAUDE_CODE_API_KEY_FILE_DESCRIPTOR"):
        descriptor_pipes({OAUTH_FD: "small", KEY_FD: "x" * (2 * 1024 * 1024)}, env)
    assert set(os.listdir("/proc/self/fd")) == before

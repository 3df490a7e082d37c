"""The pool file: credentials and where their secrets are; never a secret inline."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from agent_server.controller.errors import PoolFileError
from agent_server.controller.pool.file import (
    DEFAULT_PROBE_SPACING_SECONDS,
    Pool,
    PoolCredential,
    build_pool,
    load_pool,
)

SUB = '[[credential]]\nid = "sub-a"\nkind = "subscription"\nsecret_env = "SUB_A"\n'
ENV = {"SUB_A": "tsec-sub-a-0123456789", "GW": "tsec-gateway-0123456789"}


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "pool.toml"
    path.write_text(text)
    return load_pool(path, ENV)


def test_a_whole_pool_file(tmp_path: Path) -> None:
    """Subscriptions, the key from a file, the gateway, an agent's opt-out."""
    (tmp_path / "key").write_text("tsec-key-0123456789\n")
    text = (
        SUB
        + '[[credential]]\nid = "key"\nkind = "api_key"\nsecret_file = "key"\n'
        + '[[credential]]\nid = "gw"\nkind = "gateway"\nsecret_env = "GW"\n'
        + 'base_url = "https://gw.example/anthropic"\nmodel = "claude-sonnet-4-5"\n'
        + "[agent.ci-bot]\napi_key = false\n"
    )
    path = tmp_path / "pool.toml"
    path.write_text(text)
    pool = load_pool(path, ENV)
    assert [c.id for c in pool.credentials] == ["sub-a", "key", "gw"]
    key = pool.get("key")
    assert key is not None
    assert key.secret.get_secret_value() == "tsec-key-0123456789"
    assert "tsec" not in repr(pool)
    gateway = pool.get("gw")
    assert gateway is not None
    provider = gateway.override().provider
    assert provider is not None
    assert (provider.base_url, provider.model) == (
        "https://gw.example/anthropic",
        "claude-sonnet-4-5",
    )
    assert pool.api_key_opt_outs == frozenset({"ci-bot"})
    assert pool.subscriptions[0].override().oauth_token == pool.subscriptions[0].secret


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param(
            SUB.replace('secret_env = "SUB_A"', 'secret = "tsec-inline-0123456789"'),
            "inline secret is refused",
            id="an inline secret is refused",
        ),
        pytest.param(
            SUB.replace('"SUB_A"', '"MISSING"'), "MISSING is not set", id="an unset variable"
        ),
        pytest.param(
            SUB + 'secret_file = "x"\n', "exactly one of", id="both secret_env and secret_file"
        ),
        pytest.param(SUB.replace("subscription", "team"), "kind must be", id="an unknown kind"),
        pytest.param(SUB + SUB, "duplicate credential ids", id="a duplicate id"),
        pytest.param(SUB.replace('"sub-a"', '"sub a"'), "id must match", id="an id with a space"),
        pytest.param(
            SUB.replace('"subscription"', '"api_key"'), "no subscription", id="no subscription"
        ),
        pytest.param(
            SUB + '[[credential]]\nid = "gw"\nkind = "gateway"\nsecret_env = "GW"\n',
            "base_url",
            id="a gateway without its base URL",
        ),
        pytest.param(SUB + 'base_url = "https://x"\n', "belong to a gateway", id="a URL on a sub"),
        pytest.param(SUB + "colour = 1\n", "unknown keys", id="an unknown key"),
        pytest.param(
            SUB + "[agent.x]\napi_key = 'no'\n", "api_key must be true or false", id="a bad opt-out"
        ),
        pytest.param(SUB + "[agent.x]\ncolour = 1\n", "takes only", id="an unknown agent key"),
        pytest.param(
            SUB + "[agent.x]\nurl = 'http://x:8000'\n", "both url and token_file", id="no token"
        ),
        pytest.param(
            SUB + "[agent.x]\nurl = 'ftp://x'\ntoken_file = 't'\n", "url must be", id="a bad url"
        ),
        pytest.param(
            SUB + "[agent.x]\nurl = 'http://x'\ntoken_file = 'absent'\n",
            "agent 'x': token_file absent cannot be read",
            id="an unreadable token file",
        ),
        pytest.param(SUB + "max_concurrent_turns = 0\n", "at least 1", id="a ceiling of no turns"),
        pytest.param(
            SUB + "max_concurrent_turns = true\n", "at least 1", id="a ceiling that is a bool"
        ),
        pytest.param(
            SUB + "[limits]\nmax_concurrent_turns = 1.5\n", "at least 1", id="a default of 1.5"
        ),
        pytest.param(
            SUB + "[limits]\nprobe_spacing_seconds = -1\n", "0 or more", id="a negative spacing"
        ),
        pytest.param(SUB + "[limits]\nburst = 3\n", "takes only", id="an unknown limit"),
        pytest.param("credential = [", "not TOML", id="not TOML"),
        pytest.param("", "no [[credential]]", id="an empty file"),
    ],
)
def test_a_pool_file_that_cannot_be_used(tmp_path: Path, text: str, says: str) -> None:
    """Each mistake is a PoolFileError naming the entry and the key, never a secret."""
    with pytest.raises(PoolFileError, match=says.replace("[", r"\[").replace("|", r"\|")) as raised:
        _load(tmp_path, text)
    assert "tsec" not in str(raised.value)


def test_agents_with_their_servers(tmp_path: Path) -> None:
    """An agent's url and token (read from token_file, relative to the pool file) are kept;
    an agent with only an opt-out has no server; a token with a space names the key."""
    (tmp_path / "t1").write_text("tsec-agent-one-0123456789\n")
    text = SUB + "[agent.a1]\nurl = 'http://a1:8000/'\ntoken_file = 't1'\n"
    pool = _load(tmp_path, text + "[agent.a2]\napi_key = false\n")
    assert isinstance(pool, Pool)
    assert list(pool.agents) == ["a1"]
    assert pool.agents["a1"].url == "http://a1:8000"
    assert pool.agents["a1"].token.get_secret_value() == "tsec-agent-one-0123456789"
    assert "tsec" not in repr(pool.agents["a1"])
    assert pool.api_key_opt_outs == {"a2"}
    (tmp_path / "t1").write_text("tsec bad token")
    with pytest.raises(PoolFileError, match="agent 'a1': the token in token_file t1") as raised:
        _load(tmp_path, text)
    assert "tsec" not in str(raised.value)


def test_ceilings_and_probe_spacing(tmp_path: Path) -> None:
    """A credential's own ceiling stands; the others take [limits]' default; the spacing
    is read; without [limits] there is no ceiling and a minute's spacing."""
    other = SUB.replace("sub-a", "sub-b")
    text = SUB + "max_concurrent_turns = 4\n" + other
    loose = _load(tmp_path, text)
    assert isinstance(loose, Pool)
    assert (loose.ceiling("sub-a"), loose.ceiling("sub-b")) == (4, None)
    assert loose.probe_spacing_seconds == DEFAULT_PROBE_SPACING_SECONDS
    limits = "[limits]\nmax_concurrent_turns = 1\nprobe_spacing_seconds = 90\n"
    strict = _load(tmp_path, text + limits)
    assert isinstance(strict, Pool)
    assert (strict.ceiling("sub-a"), strict.ceiling("sub-b")) == (4, 1)
    assert strict.probe_spacing_seconds == 90


def test_a_secret_with_whitespace_inside_is_refused(tmp_path: Path) -> None:
    """The secret must be a token (the server's one rule), and the error hides it."""
    path = tmp_path / "pool.toml"
    path.write_text(SUB)
    with pytest.raises(PoolFileError, match="whitespace") as raised:
        load_pool(path, {"SUB_A": "tsec two words"})
    assert "tsec" not in str(raised.value)


def _sub(ident: str, secret: str = "tsec-sub-0123456789") -> PoolCredential:  # noqa: S107
    return PoolCredential(ident, "subscription", SecretStr(secret))


def test_a_pool_built_in_code() -> None:
    """A database's rows become the same pool a file makes: order, kinds, opt-outs."""
    gateway = PoolCredential(
        "gw", "gateway", SecretStr("tsec-gateway-0123456789"), "https://gw.example/anthropic"
    )
    pool = build_pool([_sub("sub-a"), gateway], api_key_opt_outs=["ci-bot"])
    assert [c.id for c in pool.credentials] == ["sub-a", "gw"]
    assert pool.api_key_opt_outs == frozenset({"ci-bot"})


@pytest.mark.parametrize(
    ("credentials", "opt_outs", "says"),
    [
        pytest.param([], [], "no credentials", id="empty"),
        pytest.param([_sub("a"), _sub("a")], [], "duplicate credential ids", id="duplicate"),
        pytest.param([_sub("bad id")], [], "id must match", id="bad id"),
        pytest.param([_sub("a", "two words")], [], "'a': the secret", id="secret not a token"),
        pytest.param(
            [PoolCredential("k", "api_key", SecretStr("tsec-key-0123456789"))],
            [],
            "no subscription",
            id="no subscription",
        ),
        pytest.param(
            [_sub("a"), PoolCredential("g", "gateway", SecretStr("tsec-g-0123456789"))],
            [],
            "'g': base_url",
            id="gateway without url",
        ),
        pytest.param(
            [PoolCredential("a", "subscription", SecretStr("tsec-a-0123"), "https://x.example")],
            [],
            "belong to a gateway",
            id="url on a subscription",
        ),
        pytest.param([_sub("a")], ["no such agent!"], "agent", id="bad agent name"),
    ],
)
def test_a_pool_built_in_code_is_checked_as_a_file_is(
    credentials: list[PoolCredential], opt_outs: list[str], says: str
) -> None:
    """The TOML loader's validation, for a pool that never was a file; no value echoed."""
    with pytest.raises(PoolFileError, match=says) as raised:
        build_pool(credentials, api_key_opt_outs=opt_outs)
    assert "tsec" not in str(raised.value)

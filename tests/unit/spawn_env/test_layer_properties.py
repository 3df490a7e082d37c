"""Properties of the spawn env and the drift report over generated layers (contract §4).

The table tests in test_layers.py and ../credentials/test_drift.py name the cases; these check that
the rules hold for every mix of names and layers hypothesis can think of. Every
generated value starts with `val-`, which no variable name contains, so a value that
leaks anywhere is found by a substring search. Which names are protected or
server-only is spelled out here from docs/contract.md, not taken from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from agent_server.credentials.state import CredentialState
from agent_server.credentials.status import effective_auth, env_drift, spawn_preview
from agent_server.spawn_env.layers import (
    Overrides,
    PerSpawn,
    SpawnEnv,
    build_spawn_env,
)

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# contract §4's protected `.env` keys and contract §1/§4's server-only names, written out here.
CONTRACT_PROTECTED = re.compile(
    r"^(PATH|HOME|LD_.*|PYTHON.*|NODE_OPTIONS|BASH_ENV|ENV|IFS|GIT_SSH|GIT_SSH_COMMAND"
    r"|GIT_EXEC_PATH|GIT_ASKPASS|TRINITY_AGENT_AUTH_TOKEN|AGENT_SERVER_.*)$"
)
CONTRACT_SERVER_ONLY = re.compile(r"^(TRINITY_AGENT_AUTH_TOKEN|AGENT_SERVER_.*)$")
CONTRACT_CREDENTIAL = re.compile(
    r"^(ANTHROPIC_API_KEY|ANTHROPIC_AUTH_TOKEN|CLAUDE_CODE_OAUTH_TOKEN|.*_API_KEY|.*_TOKEN"
    r"|.*_SECRET|.*_PASSWORD)$"
)

NAMED = (
    "CLAUDE_CODE_OAUTH_TOKEN",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
    "TRINITY_EXECUTION_ID",
    "TRINITY_AGENT_AUTH_TOKEN",
    "AGENT_SERVER_PORT",
    "AGENT_SERVER_STATE_DIR",
    "PATH",
    "HOME",
    "LD_PRELOAD",
    "PYTHONPATH",
    "NODE_OPTIONS",
    "BASH_ENV",
    "ENV",
    "IFS",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
    "GITHUB_TOKEN",
    "DB_PASSWORD",
    "FOO",
    "LANG",
)
names = st.one_of(st.sampled_from(NAMED), st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True))
# What a credential override or the per-spawn layer can carry: never a server setting.
spawn_names = names.filter(lambda n: CONTRACT_SERVER_ONLY.match(n) is None)


def values(layer: str) -> st.SearchStrategy[str]:
    """Values of one layer: `val-<layer>-…`, never equal to a value of another layer."""
    return st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=10).map(
        lambda text: f"val-{layer}-{text}"
    )


baselines = st.dictionaries(names, values("base"), max_size=8)
dotenvs = st.dictionaries(names, values("file"), max_size=8)
overrides_st = st.dictionaries(
    spawn_names, st.one_of(st.none(), values("over").map(SecretStr)), max_size=6
)
per_spawns = st.builds(
    PerSpawn,
    values=st.dictionaries(
        spawn_names, st.one_of(values("spawn"), values("spawnsecret").map(SecretStr)), max_size=4
    ),
    drop=st.frozensets(names, max_size=5),
)


def plain(value: SecretStr | str) -> str:
    """The value a spawn receives for a layer entry."""
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def build(
    baseline: Mapping[str, str], dotenv: Mapping[str, str], overrides: Overrides, spawn: PerSpawn
) -> SpawnEnv:
    """The spawn env, checked to keep `env` and `sources` in step."""
    result = build_spawn_env(baseline, dotenv, overrides, spawn)
    assert set(result.env) == set(result.sources)
    return result


@PROPERTY
@given(baselines, dotenvs, overrides_st, per_spawns)
def test_the_drop_set_always_wins(
    baseline: dict[str, str], dotenv: dict[str, str], overrides: Overrides, spawn: PerSpawn
) -> None:
    """No dropped name reaches the spawn, whichever layer supplied it."""
    result = build(baseline, dotenv, overrides, spawn)
    assert not spawn.drop & set(result.env)


@PROPERTY
@given(baselines, dotenvs, overrides_st, per_spawns)
def test_a_force_unset_name_arrives_only_through_the_per_spawn_layer(
    baseline: dict[str, str], dotenv: dict[str, str], overrides: Overrides, spawn: PerSpawn
) -> None:
    """A name an override force-unsets is present exactly when this spawn sets it itself."""
    result = build(baseline, dotenv, overrides, spawn)
    for name in (n for n, v in overrides.items() if v is None):
        own = name in spawn.values and name not in spawn.drop
        assert (name in result.env) == own, name
        if own:
            assert result.sources[name] == "per_spawn"
            assert result.env[name] == plain(spawn.values[name])


@PROPERTY
@given(baselines, dotenvs, overrides_st, per_spawns)
def test_a_protected_name_never_carries_its_dotenv_value(
    baseline: dict[str, str], dotenv: dict[str, str], overrides: Overrides, spawn: PerSpawn
) -> None:
    """`.env` cannot set PATH, LD_*, PYTHON*, exec hooks or server names; each is reported."""
    result = build(baseline, dotenv, overrides, spawn)
    for name in (n for n in dotenv if CONTRACT_PROTECTED.match(n)):
        assert result.env.get(name) != dotenv[name], name
        assert result.sources.get(name) != "env_file", name
        assert name in result.ignored
    for name, source in result.sources.items():
        if source == "env_file":
            assert CONTRACT_PROTECTED.match(name) is None, name


@PROPERTY
@given(baselines, dotenvs, overrides_st, per_spawns)
def test_server_only_names_never_reach_a_spawn(
    baseline: dict[str, str], dotenv: dict[str, str], overrides: Overrides, spawn: PerSpawn
) -> None:
    """TRINITY_AGENT_AUTH_TOKEN and AGENT_SERVER_* from the process env or `.env` stay out."""
    result = build(baseline, dotenv, overrides, spawn)
    assert [n for n in result.env if CONTRACT_SERVER_ONLY.match(n)] == []


def fingerprint12(value: str) -> str:
    """The hex digits any fingerprint of `value` would show."""
    return hashlib.sha256(value.encode()).hexdigest()[:12]


@PROPERTY
@given(baselines, dotenvs, overrides_st)
def test_the_drift_report_shows_names_never_values(
    baseline: dict[str, str], dotenv: dict[str, str], overrides: Overrides
) -> None:
    """No layer's value, nor a non-credential value's fingerprint, is in the drift JSON."""
    state = CredentialState.create(baseline, overrides, generation=1)
    preview = spawn_preview(state, dotenv)
    auth = effective_auth(preview)
    report = json.dumps(
        {
            "env_drift": [row.model_dump() for row in env_drift(state, dotenv, preview)],
            "effective_auth": (auth.model_dump() if auth is not None else None),
        },
        ensure_ascii=False,
    )
    assert "val-" not in report
    layers = [*baseline.items(), *dotenv.items()]
    layers += [(n, v.get_secret_value()) for n, v in overrides.items() if v is not None]
    credential_values = {v for n, v in layers if CONTRACT_CREDENTIAL.match(n)}
    for name, value in layers:
        assert value not in report
        if value not in credential_values:
            assert fingerprint12(value) not in report, name
    # Names only, but every name: a row per .env key and per overridden name.
    keys = {row["key"] for row in json.loads(report)["env_drift"]}
    assert set(dotenv) | set(overrides) <= keys

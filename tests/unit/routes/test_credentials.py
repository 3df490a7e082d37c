"""reload-token (contract §4.4) and status (§4.5): answers, metrics, the file, env_shadow."""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_server.credentials.state import fingerprint
from agent_server.services import Services
from tests.support.in_process import app_client, fake_cli_services

pytestmark = pytest.mark.timeout(60)

RELOAD = "/api/credentials/reload-token"
STATUS = "/api/credentials/status"
BASELINE_OAUTH = "unit-baseline-oauth-0123456789"
ROTATED = "unit-rotated-oauth-0123456789"
DOTENV_KEY = "unit-dotenv-api-key-0123456789"


@pytest.fixture
def services(environ: dict[str, str]) -> Services:
    """A Claude agent with a baseline OAuth token (so the subscription guard is armed)."""
    return fake_cli_services(environ, CLAUDE_CODE_OAUTH_TOKEN=BASELINE_OAUTH)


def _send(services: Services, *requests: tuple[str, str, Any]) -> list[httpx.Response]:
    """Send (method, path, json body or raw bytes) in order on one app."""

    async def scenario() -> list[httpx.Response]:
        answers = []
        async with app_client(services) as client:
            for method, path, body in requests:
                if isinstance(body, bytes):
                    answers.append(await client.request(method, path, content=body))
                else:
                    answers.append(await client.request(method, path, json=body))
        return answers

    return asyncio.run(scenario())


def _reloads(services: Services) -> dict[str, float]:
    """agent_server_credential_reloads_total by result, only the results that were counted."""
    counted = {}
    for metric in services.metrics.registry.collect():
        if metric.name == "agent_server_credential_reloads":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    counted[sample.labels["result"]] = sample.value
    return counted


def test_a_reload_persists_swaps_and_answers_the_contract_body(services: Services) -> None:
    """200 with every §4.4 field; the file holds the raw token at 0600; counted `changed`."""
    booted = services.store.current.generation
    (response,) = _send(services, ("POST", RELOAD, {"token": ROTATED}))
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "status": "success",
        "reloaded": True,
        "changed": True,
        "generation": services.store.current.generation,
        "fingerprint": fingerprint(ROTATED),
        "persisted": True,
        "env_shadow": [],
    }
    assert body["generation"] > booted
    override = services.settings.override_file
    assert override.read_text() == ROTATED
    assert stat.S_IMODE(override.stat().st_mode) == 0o600
    assert _reloads(services) == {"changed": 1}


def test_the_same_reload_again_is_unchanged_and_rewrites_a_lost_file(services: Services) -> None:
    """Same token and flag: changed false, same generation; a deleted file is written again."""
    first, second = _send(
        services, ("POST", RELOAD, {"token": ROTATED}), ("POST", RELOAD, {"token": ROTATED})
    )
    services.settings.override_file.unlink()
    (third,) = _send(services, ("POST", RELOAD, {"token": ROTATED}))
    assert [r.json()["changed"] for r in (first, second, third)] == [True, False, False]
    assert first.json()["generation"] == second.json()["generation"] == third.json()["generation"]
    assert services.settings.override_file.read_text() == ROTATED
    assert _reloads(services) == {"changed": 1, "unchanged": 2}


def test_a_matching_expected_generation_is_a_successful_compare_and_swap(
    services: Services,
) -> None:
    """expected_generation equal to the current one: the reload goes through."""
    current = services.store.current.generation
    (response,) = _send(
        services, ("POST", RELOAD, {"token": ROTATED, "expected_generation": current})
    )
    assert response.status_code == 200
    assert response.json()["generation"] > current


@pytest.mark.parametrize(
    ("body", "status", "result"),
    [
        pytest.param({"token": ""}, 400, "token_required", id="an empty token is 400"),
        pytest.param({"token": " \t "}, 400, "token_required", id="a blank token is 400"),
        pytest.param({}, 422, "validation_failed", id="no token at all is 422"),
        pytest.param(
            {"token": "unit rotated oauth 0123456789"},
            400,
            "token_invalid",
            id="a space inside is 400 token_invalid",
        ),
        pytest.param(
            {"token": "sk-ant-oat01-…"},
            400,
            "token_invalid",
            id="the README's placeholder is 400 token_invalid",
        ),
        pytest.param({"token": "hello"}, 400, "token_invalid", id="a word is 400 token_invalid"),
        pytest.param(
            {"token": "unit-rotated\x01oauth"},
            400,
            "token_invalid",
            id="a control character is 400 token_invalid",
        ),
        pytest.param(
            {"token": "x" * 4097}, 400, "token_invalid", id="over 4096 bytes is 400 token_invalid"
        ),
        pytest.param(
            {"token": ROTATED, "remove_api_keys": True},
            422,
            "validation_failed",
            id="an unknown field is 422",
        ),
        pytest.param(b"{not json", 422, "validation_failed", id="a body that is not JSON is 422"),
        pytest.param(
            {"token": ROTATED, "expected_generation": 1},
            409,
            "generation_mismatch",
            id="a stale expected_generation is 409",
        ),
    ],
)
def test_a_refused_reload_changes_nothing_and_counts_its_result(
    services: Services, body: Any, status: int, result: str
) -> None:
    """The status and error code of §4.4; no file, same state; one count under its result."""
    before = services.store.current
    (response,) = _send(services, ("POST", RELOAD, body))
    assert response.status_code == status
    detail = response.json()["detail"]
    if status == 422:
        assert isinstance(detail, list)
        assert detail
    else:
        assert detail["error_code"] == result
    assert services.store.current is before
    assert not services.settings.override_file.exists()
    assert _reloads(services) == {result: 1}
    assert "rotated" not in response.text
    assert "x" * 64 not in response.text


def _open_state_dir(state_dir: Path) -> None:
    state_dir.chmod(0o777)


def _symlinked_file(state_dir: Path) -> None:
    (state_dir.parent / "elsewhere").write_text("untouched")
    (state_dir / "oauth-token").symlink_to(state_dir.parent / "elsewhere")


def _directory_in_the_way(state_dir: Path) -> None:
    (state_dir / "oauth-token").mkdir()


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(_open_state_dir, id="a state dir writable by others is refused"),
        pytest.param(_symlinked_file, id="a symlink at the file is never followed"),
        # A read-only state dir is a real read-only mount in
        # tests/e2e/credentials/test_override_file_faults.py: a 0500 directory proves
        # nothing when the suite runs as root.
        pytest.param(_directory_in_the_way, id="a directory where the file goes"),
    ],
)
def test_a_reload_that_cannot_persist_is_500_and_changes_nothing(
    services: Services, spoil: Callable[[Path], None]
) -> None:
    """500 persist_failed with the reason, never the token; memory and the metric agree."""
    state_dir = services.settings.state_dir
    before = services.store.current
    spoil(state_dir)
    try:
        (response,) = _send(services, ("POST", RELOAD, {"token": ROTATED}))
    finally:
        state_dir.chmod(0o700)
    assert response.status_code == 500
    detail = response.json()["detail"]
    assert detail["error_code"] == "persist_failed"
    assert detail["message"].startswith("could not write the token override file: ")
    assert ROTATED not in response.text
    assert services.store.current is before
    assert _reloads(services) == {"persist_failed": 1}
    if (state_dir.parent / "elsewhere").exists():
        assert (state_dir.parent / "elsewhere").read_text() == "untouched"


@pytest.mark.parametrize(
    ("dotenv", "remove_api_key", "shadow"),
    [
        pytest.param(
            "CLAUDE_CODE_USE_VERTEX=1\nOTHER=x\n"
            f"ANTHROPIC_AUTH_TOKEN=gateway-{DOTENV_KEY}\nANTHROPIC_API_KEY={DOTENV_KEY}\n",
            True,
            ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_USE_VERTEX"],
            id="remove_api_key names the shadow keys .env still carries, in contract order",
        ),
        pytest.param(
            f"ANTHROPIC_API_KEY={DOTENV_KEY}\n",
            False,
            ["ANTHROPIC_API_KEY"],
            id="without remove_api_key it still names what the armed guard unsets",
        ),
        pytest.param("OTHER=x\n", True, [], id="a .env without shadow keys has none to name"),
        pytest.param(None, True, [], id="no .env at all has none to name"),
    ],
)
def test_env_shadow_names_never_values(
    services: Services, dotenv: str | None, remove_api_key: bool, shadow: list[str]
) -> None:
    """env_shadow lists names from .env (never their values); .env is never written."""
    env_file = services.settings.env_file
    if dotenv is not None:
        env_file.write_text(dotenv)
    (response,) = _send(
        services, ("POST", RELOAD, {"token": ROTATED, "remove_api_key": remove_api_key})
    )
    assert response.status_code == 200
    assert response.json()["env_shadow"] == shadow
    assert DOTENV_KEY not in response.text
    if dotenv is not None:
        assert env_file.read_text() == dotenv


def test_the_reloaded_token_is_masked_from_then_on(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """The redactor learns the token before anything can quote it; the log line shows none."""
    with caplog.at_level(logging.INFO, logger="agent_server.credentials"):
        reload, quoted = _send(
            services,
            ("POST", RELOAD, {"token": ROTATED}),
            ("POST", f"/api/executions/{ROTATED}/terminate", None),
        )
    assert reload.status_code == 200
    assert quoted.json()["detail"]["message"] == "no execution [REDACTED]"
    (line,) = [m for m in caplog.messages if m.startswith("reload-token:")]
    assert f"fingerprint={fingerprint(ROTATED)}" in line
    assert "changed=True" in line
    assert ROTATED not in caplog.text


def test_a_token_the_store_refused_is_masked_all_the_same(services: Services) -> None:
    """A well-formed token seen once stays hidden, even when the reload changed nothing (409)."""
    refused, quoted = _send(
        services,
        ("POST", RELOAD, {"token": ROTATED, "expected_generation": 1}),
        ("POST", f"/api/executions/{ROTATED}/terminate", None),
    )
    assert refused.status_code == 409
    assert quoted.json()["detail"]["message"] == "no execution [REDACTED]"


def test_status_shows_the_next_spawns_credential_before_and_after_a_reload(
    services: Services,
) -> None:
    """The §4.5 fields: baseline first, then the override, its file 0600; never a value."""
    env_file = services.settings.env_file
    env_file.write_text(f"ANTHROPIC_API_KEY={DOTENV_KEY}\n")
    before, _, after = _send(
        services,
        ("GET", STATUS, None),
        ("POST", RELOAD, {"token": ROTATED}),
        ("GET", STATUS, None),
    )
    first, second = before.json(), after.json()
    assert set(first) == {
        "agent_name",
        "runtime",
        "generation",
        "fingerprint",
        "auth_mode",
        "guard_armed",
        "files",
        "effective_auth",
        "env_drift",
    }
    assert (first["agent_name"], first["runtime"]) == ("test-agent", "claude-code")
    assert (first["auth_mode"], first["guard_armed"]) == ("subscription", True)
    assert first["fingerprint"] == fingerprint(BASELINE_OAUTH)
    assert first["files"] == {
        "env_file": str(env_file),
        "env_file_problem": None,
        "override_file": {
            "exists": False,
            "mode": None,
            "size": None,
            "mtime": None,
            "problem": None,
        },
    }
    assert first["effective_auth"] == {
        "variable": "CLAUDE_CODE_OAUTH_TOKEN",
        "layer": "baseline",
        "fingerprint": fingerprint(BASELINE_OAUTH),
        "conflicts": [],
    }
    drift = {row["key"]: row for row in first["env_drift"]}
    assert drift["ANTHROPIC_API_KEY"]["in_file"] is True
    assert drift["ANTHROPIC_API_KEY"]["in_process_env"] is False
    assert drift["ANTHROPIC_API_KEY"]["suppressed_for_spawn"] is True
    assert drift["ANTHROPIC_API_KEY"]["spawn_source"] is None

    assert second["generation"] == services.store.current.generation > first["generation"]
    assert second["fingerprint"] == fingerprint(ROTATED)
    assert second["effective_auth"]["layer"] == "override"
    assert second["effective_auth"]["fingerprint"] == fingerprint(ROTATED)
    override = second["files"]["override_file"]
    assert (override["exists"], override["mode"], override["size"]) == (True, "0600", len(ROTATED))
    for response in (before, after):
        for secret in (BASELINE_OAUTH, ROTATED, DOTENV_KEY):
            assert secret not in response.text


def test_status_follows_the_env_file_without_a_restart(services: Services) -> None:
    """.env is read per request: a key added after boot shows in the next status."""
    env_file = services.settings.env_file
    (before,) = _send(services, ("GET", STATUS, None))
    env_file.write_text("UNIT_ADDED_LATER=1\n")
    (after,) = _send(services, ("GET", STATUS, None))
    assert "UNIT_ADDED_LATER" not in {row["key"] for row in before.json()["env_drift"]}
    assert "UNIT_ADDED_LATER" in {row["key"] for row in after.json()["env_drift"]}

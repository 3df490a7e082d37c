"""The immutable credential state, the generation, and the store's reload order (contract §4)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from agent_server.credentials.override_file import OverrideFile
from agent_server.credentials.state import CredentialState, fingerprint, next_generation
from agent_server.credentials.store import CredentialStore
from agent_server.errors import GenerationMismatch, PersistFailed

TOKEN = "oauth-token-for-state-tests"


def test_fingerprint_is_sha256_prefix() -> None:
    """`sha256:` + the first 12 hex digits, for str and SecretStr alike."""
    expected = "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()[:12]
    assert fingerprint(TOKEN) == fingerprint(SecretStr(TOKEN)) == expected


def test_generation_starts_at_boot_milliseconds_and_always_grows() -> None:
    """The first generation is epoch ms (never repeats across restarts); each next is larger."""
    before = time.time_ns() // 1_000_000
    first = next_generation()
    assert before <= first <= time.time_ns() // 1_000_000
    future = first + 10_000_000
    assert next_generation(future) == future + 1


def test_a_state_is_immutable_and_copies_its_inputs() -> None:
    """Mutating the dicts a state was built from does not change it; the state rejects writes."""
    baseline = {"A": "1"}
    overrides: dict[str, SecretStr | None] = {"B": None}
    state = CredentialState.create(baseline, overrides, 1)
    baseline["A"] = "2"
    overrides["B"] = SecretStr("x")
    assert state.baseline["A"] == "1"
    assert state.overrides["B"] is None
    with pytest.raises(TypeError):
        state.baseline["A"] = "3"  # type: ignore[index]


@pytest.mark.parametrize(
    ("baseline", "overrides", "expected"),
    [
        pytest.param({}, {}, None, id="no token anywhere"),
        pytest.param({"CLAUDE_CODE_OAUTH_TOKEN": TOKEN}, {}, TOKEN, id="the baseline token"),
        pytest.param(
            {"CLAUDE_CODE_OAUTH_TOKEN": "stale-token-abc"},
            {"CLAUDE_CODE_OAUTH_TOKEN": SecretStr(TOKEN)},
            TOKEN,
            id="an override beats the baseline token",
        ),
    ],
)
def test_active_token(
    baseline: dict[str, str], overrides: dict[str, SecretStr | None], expected: str | None
) -> None:
    """The fingerprint follows the token a spawn would carry."""
    state = CredentialState.create(baseline, overrides, 1)
    assert state.fingerprint == (fingerprint(expected) if expected else None)


def _store(tmp_path: Path, baseline: dict[str, str] | None = None) -> CredentialStore:
    state_dir = tmp_path / "state"
    return CredentialStore.boot(True, baseline or {}, OverrideFile(state_dir / "oauth-token"))


def _reload(store: CredentialStore, token: str, **kwargs: Any) -> Any:
    kwargs.setdefault("remove_api_key", False)
    kwargs.setdefault("expected_generation", None)
    return asyncio.run(store.reload(SecretStr(token), **kwargs))


def test_reload_persists_then_swaps(tmp_path: Path) -> None:
    """A reload writes the file, then a new state with a larger generation is current."""
    store = _store(tmp_path)
    old = store.current
    result = _reload(store, TOKEN)
    assert result.changed
    assert store.current is result.state
    assert result.state.generation > old.generation
    assert result.state.fingerprint == fingerprint(TOKEN)
    assert store.override_file.path.read_text() == TOKEN
    assert old.fingerprint is None  # the snapshot a spawn held is untouched


def test_the_same_reload_again_changes_nothing(tmp_path: Path) -> None:
    """Same token and flag: changed false, same generation."""
    store = _store(tmp_path)
    first = _reload(store, TOKEN, remove_api_key=True)
    again = _reload(store, TOKEN, remove_api_key=True)
    assert not again.changed
    assert again.state.generation == first.state.generation


def test_an_idempotent_reload_rewrites_a_lost_file(tmp_path: Path) -> None:
    """An unchanged state whose file went missing is persisted again."""
    store = _store(tmp_path)
    _reload(store, TOKEN)
    store.override_file.path.unlink()
    assert not _reload(store, TOKEN).changed
    assert store.override_file.path.read_text() == TOKEN


def test_remove_api_key_arms_every_shadow_key(tmp_path: Path) -> None:
    """`remove_api_key` force-unsets every SUBSCRIPTION_SHADOW_KEYS name."""
    store = _store(tmp_path, {"ANTHROPIC_API_KEY": "platform-key-1"})
    assert not store.current.guard_armed
    assert _reload(store, TOKEN, remove_api_key=True).state.guard_armed


def test_a_stale_expected_generation_is_refused(tmp_path: Path) -> None:
    """expected_generation != current: GenerationMismatch, nothing written or swapped."""
    store = _store(tmp_path)
    current = store.current
    with pytest.raises(GenerationMismatch):
        _reload(store, TOKEN, expected_generation=current.generation - 1)
    assert store.current is current
    assert not store.override_file.path.exists()
    assert _reload(store, TOKEN, expected_generation=current.generation).changed


def test_a_failed_write_changes_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    """PersistFailed: the state, its generation and the file stay as they were."""
    store = _store(tmp_path)
    _reload(store, TOKEN)
    current = store.current

    def disk_full(token: SecretStr) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.override_file, "write_atomic", disk_full)
    with pytest.raises(PersistFailed, match="No space left"):
        _reload(store, "another-token-123", remove_api_key=True)
    assert store.current is current
    assert store.override_file.path.read_text() == TOKEN


@pytest.mark.parametrize("fails", [False, True], ids=["written", "failed"])
def test_a_slow_write_leaves_the_event_loop_serving(
    tmp_path: Path, monkeypatch: Any, fails: bool
) -> None:
    """The loop serves others while the write goes on (a slow or hung disk never holds
    it); the write's end is awaited: the swap after it, or PersistFailed, nothing changed."""
    store = _store(tmp_path)
    current = store.current
    write = store.override_file.write_atomic
    release = threading.Event()
    released: list[bool] = []

    def slow_write(token: SecretStr) -> None:
        released.append(release.wait(5))  # only the loop, once free, can release it
        if fails:
            raise OSError(5, "Input/output error")
        write(token)

    monkeypatch.setattr(store.override_file, "write_atomic", slow_write)

    async def scenario() -> None:
        reload = asyncio.ensure_future(
            store.reload(SecretStr(TOKEN), remove_api_key=False, expected_generation=None)
        )
        await asyncio.sleep(0)  # the reload runs until it lets go of the loop
        assert not reload.done()
        assert store.current is current
        release.set()
        if fails:
            with pytest.raises(PersistFailed, match="Input/output error"):
                await reload
        else:
            assert (await reload).changed

    asyncio.run(scenario())
    assert released == [True]
    if fails:
        assert store.current is current
        assert not store.override_file.path.exists()
    else:
        assert store.current.fingerprint == fingerprint(TOKEN)
        assert store.override_file.path.read_text() == TOKEN


def test_boot_loads_the_override_file_over_a_stale_baseline(tmp_path: Path) -> None:
    """A rotated token beats a stale baseline CLAUDE_CODE_OAUTH_TOKEN across restarts."""
    _reload(_store(tmp_path), TOKEN)
    rebooted = _store(tmp_path, {"CLAUDE_CODE_OAUTH_TOKEN": "stale-baseline-token"})
    assert rebooted.current.fingerprint == fingerprint(TOKEN)

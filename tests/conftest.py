"""Fixtures shared by every test tier: the test-secret registry and a clean agent env."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

import pytest


class SecretRegistry:
    """Every credential value a test hands to the server, so leak checks can look for it.

    Values are deliberately NOT token-shaped (no `sk-ant-`), so only exact-value
    redaction can hide them: a leak check then proves the redactor, not a pattern.
    """

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    def new(self, label: str) -> str:
        """A fresh random secret, remembered under `label`."""
        return self.add(label, f"tsec{label.replace('_', '')}{secrets.token_hex(12)}")

    def add(self, label: str, value: str) -> str:
        """Remember an existing secret value (e.g. one the server generated)."""
        self._values[value] = label
        return value

    def leaks(self, texts: Iterable[str]) -> list[str]:
        """Labels of registered secrets that occur in any of `texts`."""
        joined = "\n".join(texts)
        return sorted({label for value, label in self._values.items() if value in joined})


def unavailable(reason: str) -> NoReturn:
    """Skip a test that cannot run on this machine, but fail it under CI, where every
    tier must run (`.ci/run` provides what it needs: root, a docker daemon, …)."""
    if os.environ.get("CI"):
        pytest.fail(f"under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def secret_registry() -> SecretRegistry:
    """The session-wide registry of test credential values."""
    return SecretRegistry()


def agent_environ(root: Path) -> dict[str, str]:
    """A minimal process env for an agent-server whose home, state and `.env` live in `root`."""
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "AGENT_NAME": "test-agent",
        "AGENT_SERVER_STATE_DIR": str(root / "state"),
        "AGENT_SERVER_ENV_FILE": str(home / ".env"),
        "AGENT_SERVER_WORKDIR": str(home),
    }


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    """A minimal agent env rooted in this test's tmp_path (add credentials per test)."""
    return agent_environ(tmp_path)


# --- the leak sweep runs last, over everything the session's servers said ----------

SWEEP_MARK = "leak_sweep"
_E2E_RAN = pytest.StashKey[int]()


# Each tier is a marker, given by the folder a test lives in: `pytest -m unit`, `-m "e2e
# and not realcli"`, `-m image`. The folders say where a test belongs; the markers select.
TIERS = {
    "unit": "the package's decisions, in-process (tests/unit)",
    "repo": "the repository's artifacts: layers, README, contract, Dockerfile (tests/repo)",
    "e2e": "a real server on loopback (tests/e2e)",
    "image": "the built image in a real docker daemon (tests/image)",
}
_TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """Register the tiers' markers and the leak sweep's."""
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {what}")
    config.addinivalue_line("markers", f"{SWEEP_MARK}: runs after every other test")


def _tier(item: pytest.Item) -> str | None:
    """The tier of `item`: the first folder under tests/ it lives in, when that is a tier."""
    try:
        folder = item.path.resolve().relative_to(_TESTS).parts[0]
    except ValueError:
        return None
    return folder if folder in TIERS else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, before `-m` selects: a test in no tier's folder
    (and not the leak sweep, which carries its tiers) would be in no lane of `make test`."""
    for item in items:
        if (tier := _tier(item)) is not None:
            item.add_marker(tier)
        elif not any(item.get_closest_marker(tier) for tier in TIERS):
            msg = f"{item.nodeid} is in no tier's folder: {sorted(TIERS)}"
            raise pytest.UsageError(msg)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Move the leak sweep to the end, and count the end-to-end tests it sweeps after."""
    items = session.items
    sweeps = [item for item in items if item.get_closest_marker(SWEEP_MARK)]
    items[:] = [item for item in items if item not in sweeps] + sweeps
    count = sum(item.get_closest_marker("e2e") is not None for item in items)
    session.config.stash[_E2E_RAN] = count


@pytest.fixture
def end_to_end_tests_ran(request: pytest.FixtureRequest) -> int:
    """How many end-to-end tests this session collected before the sweep."""
    return request.config.stash.get(_E2E_RAN, 0)

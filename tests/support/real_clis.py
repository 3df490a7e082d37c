"""The three real CLIs the suite runs: where `make` installs them, and finding them.

The Makefile pins each version (`CLAUDE_CODE_VERSION`, `CODEX_VERSION`,
`GEMINI_CLI_VERSION`), installs it from npm into `.cache/<name>-<version>/` and exports
its path as `AGENT_SERVER_TEST_<NAME>_BIN`; `make conformance` does the same for any
versions given. A test asks `require()`: under CI (`CI` set) a missing CLI fails the
test, locally it skips.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pinned_version(variable: str) -> str:
    """The version the Makefile pins in `variable` (`CODEX_VERSION := 0.171.0`)."""
    text = (REPO / "Makefile").read_text()
    match = re.search(rf"^{variable}\s*[:?]?=\s*(\S+)\s*$", text, re.MULTILINE)
    if match is None:
        msg = f"the Makefile pins no {variable}"
        raise LookupError(msg)
    return match[1]


@dataclass(frozen=True)
class RealCli:
    """One CLI: its cache folder's name, the Makefile's pin, its executable under it."""

    name: str
    version_variable: str
    executable: str
    """Relative to the cache folder."""

    @property
    def env_variable(self) -> str:
        """`AGENT_SERVER_TEST_<NAME>_BIN`, which `make test` exports."""
        return f"AGENT_SERVER_TEST_{self.name.split('-')[0].upper()}_BIN"

    @property
    def version(self) -> str:
        """The pinned version."""
        return pinned_version(self.version_variable)

    @property
    def installed(self) -> Path:
        """Where `make test` installs the pinned version."""
        return REPO / ".cache" / f"{self.name}-{self.version}" / self.executable

    def path(self) -> Path | None:
        """The configured executable, else the pinned install when present."""
        configured = os.environ.get(self.env_variable)
        if configured:
            return Path(configured)
        return self.installed if self.installed.exists() else None

    def require(self) -> Path:
        """The executable: fails under CI when missing, skips locally."""
        configured = os.environ.get(self.env_variable)
        if os.environ.get("CI") and not configured:
            pytest.fail(f"CI is set but {self.env_variable} is not: run the suite via make test")
        path = self.path()
        if path is not None and os.access(path, os.X_OK):
            return path
        if configured:
            pytest.fail(f"{self.env_variable}={configured!r} is not an executable")
        pytest.skip(f"the real {self.name} CLI is not installed; run `make test`")


CLAUDE = RealCli(
    "claude-code", "CLAUDE_CODE_VERSION", "node_modules/@anthropic-ai/claude-code/bin/claude.exe"
)
CODEX = RealCli("codex", "CODEX_VERSION", "node_modules/@openai/codex/bin/codex.js")
GEMINI = RealCli(
    "gemini-cli", "GEMINI_CLI_VERSION", "node_modules/@google/gemini-cli/bundle/gemini.js"
)


def broker_default(command: str | None) -> str:
    """`AGENT_SERVER_BROKER` for a server whose runtime command is `command`, where the
    test says nothing: the product's default (on) for a real CLI or the default `claude`,
    off for a stand-in.

    A stand-in CLI (fake-claude, the hostile and intruder CLIs) makes no API exchange:
    through the broker its turns would name no credential (contract §4.8) and its report
    would show placeholders. Its tests are of the spawn, the layering and the output,
    which the broker leaves as they are; the broker's own tests set `AGENT_SERVER_BROKER=1`.
    """
    if command is None:
        return "1"
    real = {path.resolve() for cli in (CLAUDE, CODEX, GEMINI) if (path := cli.path())}
    return "1" if Path(command).resolve() in real else "0"

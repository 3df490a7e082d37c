"""Runtime adapters: one module a CLI, chosen by `AGENT_RUNTIME`."""

from __future__ import annotations

from agent_server.runtimes.base import RuntimeAdapter
from agent_server.runtimes.claude_code import ClaudeCodeAdapter
from agent_server.runtimes.codex import CodexAdapter
from agent_server.runtimes.gemini import GeminiAdapter


def adapter_for(runtime: str) -> RuntimeAdapter:
    """The adapter of a canonical runtime name (`Settings` has checked it)."""
    adapters: dict[str, RuntimeAdapter] = {
        "claude-code": ClaudeCodeAdapter(),
        "codex": CodexAdapter(),
        "gemini-cli": GeminiAdapter(),
    }
    return adapters[runtime]

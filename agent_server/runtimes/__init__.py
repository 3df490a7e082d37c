"""Runtime adapters: one module a CLI, chosen by `AGENT_RUNTIME`."""

from __future__ import annotations

from agent_server.runtimes.base import RuntimeAdapter
from agent_server.runtimes.claude_code import ClaudeCodeAdapter
from agent_server.runtimes.codex import CodexAdapter
from agent_server.runtimes.gemini import GeminiAdapter

ADAPTERS: tuple[RuntimeAdapter, ...] = (ClaudeCodeAdapter(), CodexAdapter(), GeminiAdapter())
RUNTIME_NAMES: dict[str, str] = {
    spelling: adapter.name for adapter in ADAPTERS for spelling in (adapter.name, *adapter.aliases)
}
"""Every spelling `AGENT_RUNTIME` accepts -> the canonical runtime name."""
MODEL_REJECTION_MARKERS: dict[str, str] = {
    marker: unmarked
    for adapter in ADAPTERS
    for marker, unmarked in adapter.hints.model_rejection_markers.items()
}
"""Every runtime's stderr marker of an unknown model -> its spelling in another outcome's
message (the controller reads the marker as a rejection, whatever the status)."""


def adapter_for(runtime: str) -> RuntimeAdapter:
    """The adapter of a canonical runtime name (`Settings` has checked it)."""
    return next(adapter for adapter in ADAPTERS if adapter.name == runtime)

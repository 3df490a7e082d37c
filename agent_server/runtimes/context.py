"""How large a model's context window is, when the CLI does not say (contract §6.5).

Claude Code reports the window of the model it used (`modelUsage.<model>.contextWindow`);
Codex and Gemini CLI do not. The fallback goes by the model id's family, first match
wins; an id that names the extended window (`[1m]`) has it.
"""

from __future__ import annotations

DEFAULT_CONTEXT_WINDOW = 200_000
EXTENDED_CONTEXT_WINDOW = 1_000_000
_BY_FAMILY = (
    ("gemini", 1_000_000),
    ("gpt-5", 272_000),
    ("codex", 272_000),
    ("claude", DEFAULT_CONTEXT_WINDOW),
    ("opus", DEFAULT_CONTEXT_WINDOW),
    ("sonnet", DEFAULT_CONTEXT_WINDOW),
    ("haiku", DEFAULT_CONTEXT_WINDOW),
)


def context_window_for(model: str | None) -> int:
    """The window of `model` by its family (200,000 tokens for an unknown or no model)."""
    lowered = (model or "").lower()
    if "[1m]" in lowered:
        return EXTENDED_CONTEXT_WINDOW
    for family, window in _BY_FAMILY:
        if family in lowered:
            return window
    return DEFAULT_CONTEXT_WINDOW

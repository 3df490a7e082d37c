"""Facts of docs/contract.md that tests check answers against, stated here, not imported."""

from __future__ import annotations

from tests.support.trinity import AUTH_INDICATORS, MODEL_REJECTION_MARKERS

ERROR_DETAIL_KEYS = (
    "message",
    "error_code",
    "retryable",
    "switch_credential",
    "execution_id",
    "auth_route",
    "api_error_status",
    "resets_at",
    "rate_limit_type",
    "metadata",
    "execution_log",
)
"""The keys of every turn error's `detail`, in order (contract §7)."""

KEPT_CONTROLLER_WORDS: dict[str, tuple[str, ...]] = {
    "auth": AUTH_INDICATORS,
    "billing": ("credit balance",),
    "model_unsupported": MODEL_REJECTION_MARKERS,
}
"""Which of the controller's words a message may hold, by error code (contract §7).

Any other error's message holds none of Trinity's auth indicators and no
model-rejection marker, whatever the CLI printed.
"""


def stray_controller_words(error_code: str | None, message: str) -> list[str]:
    """The controller words `message` holds that an `error_code` message must not."""
    kept = KEPT_CONTROLLER_WORDS.get(error_code or "", ())
    lowered = message.lower()
    return [
        word
        for word in (*AUTH_INDICATORS, *MODEL_REJECTION_MARKERS)
        if word in lowered and word not in kept
    ]


CLAUDE_TURN_OPTIONS = [
    "model",
    "system_prompt",
    "allowed_tools",
    "max_turns",
    "resume_session_id",
    "persist_session",
    "images",
]
"""`capabilities.turn_options` of a Claude Code agent: every turn option (contract §6.1)."""

CODEX_TURN_OPTIONS = ["model", "system_prompt", "resume_session_id", "persist_session"]
"""`capabilities.turn_options` of a Codex agent: no tool list, turn cap or images (§6.1)."""

FRAGMENT = 8
"""No piece this long of a known secret may leave the server, redacted or clipped (§8)."""


def pieces(secret: str) -> set[str]:
    """Every FRAGMENT-character piece of `secret`."""
    return {secret[i : i + FRAGMENT] for i in range(len(secret) - FRAGMENT + 1)}


def leaked(secret: str, text: str) -> list[str]:
    """The pieces of `secret` that occur in `text`, sorted."""
    return sorted(piece for piece in pieces(secret) if piece in text)

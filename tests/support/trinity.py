"""How Trinity's backend reads our answers, stated as facts for tests to hold us to.

Trinity (github.com/Abilityai/trinity) is the controller this server is built for.
Nothing here is its code: each rule below is restated from the backend file named
beside it, so a test can play the controller over a live answer and check what it
would decide. When Trinity changes a rule, this module is the one place to follow.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

# src/backend/services/failure_classifier.py: AUTH_INDICATORS. Any of these (lower
# case, as a substring) in a failed turn's `detail.message` reads as "the credential".
AUTH_INDICATORS = (
    "credit balance",
    "unauthorized",
    "authentication",
    "credentials",
    "forbidden",
    "401",
    "403",
    "oauth",
    "token expired",
    "not authenticated",
)

# failure_classifier.py: NON_AUTH_KILL_MARKERS. A message holding one is never auth,
# whatever else it says (a killed process is not a refused credential).
NON_AUTH_KILL_MARKERS = (
    "sigkill",
    "sigterm",
    "sigint",
    "exit code -9",
    "exit code -15",
    "exit code -2",
    "exit code 137",
    "exit code 143",
    "exit code 130",
    "terminated by",
    "killed by",
    "out of memory",
    "oom",
    "memory cgroup",
)

# failure_classifier.py: MODEL_REJECTION_MARKERS. Checked before anything else: a
# message holding one is a model rejection and never switches, whatever its status.
MODEL_REJECTION_MARKERS = (
    "[claude-code:unrecognized_model]",
    "does not support this model",
    "model unsupported:",
)

# failure_classifier.py: CONTAINER_FAULT_MARKERS. A 503 saying one of these is the
# container's fault: no credential is tried for it.
CONTAINER_FAULT_MARKERS = (
    "claude code is not available in this container",
    "permission bypass failed",
)

# execution_classification.py: classify_switch_failure. These statuses are the
# credential's fault by status alone (429 is a rate limit).
AUTH_STATUSES = (503, 401, 403, 402)

# cleanup_service.py: the watchdog fails a running execution row that the agent has
# not listed for this long.
WATCHDOG_GRACE_S = 60


def is_model_rejection(message: str) -> bool:
    """failure_classifier.py: the message names a model the CLI refused."""
    lowered = message.lower()
    return any(marker in lowered for marker in MODEL_REJECTION_MARKERS)


def is_auth_failure(message: str) -> bool:
    """failure_classifier.py: an auth word, and neither a kill marker nor a rejection."""
    lowered = message.lower()
    if any(marker in lowered for marker in NON_AUTH_KILL_MARKERS):
        return False
    if is_model_rejection(message):
        return False
    return any(word in lowered for word in AUTH_INDICATORS)


def switch_reason(status: int, message: str) -> str | None:
    """What Trinity walks the pool for: `rate_limit`, `auth`, or None (no switch).

    execution_classification.py's classify_switch_failure (a model rejection first,
    then 429, then the auth statuses, then the auth words of any other failure), with
    the container-fault exception the subscription walk makes for a 503.
    """
    if status < 400 or is_model_rejection(message):
        return None
    if status == 429:
        return "rate_limit"
    if status in AUTH_STATUSES:
        lowered = message.lower()
        return None if any(m in lowered for m in CONTAINER_FAULT_MARKERS) else "auth"
    return "auth" if is_auth_failure(message) else None


def context_used(metadata: Mapping[str, Any]) -> int | None:
    """execution_classification.py: the tokens a turn's context held.

    The prompt cache's reads and writes when there are any, else `input_tokens`;
    None when neither says anything.
    """
    cached = (metadata.get("cache_read_tokens") or 0) + (metadata.get("cache_creation_tokens") or 0)
    if cached > 0:
        return int(cached)
    input_tokens = metadata.get("input_tokens") or 0
    return int(input_tokens) if input_tokens > 0 else None


def watchdog_known(running: Mapping[str, Any]) -> set[str]:
    """cleanup_service.py: the ids `/api/executions/running` vouches for.

    A running row whose id is in none of these lists is failed after
    `WATCHDOG_GRACE_S` and its slot released.
    """
    listed = {e["execution_id"] for e in running.get("executions", [])}
    return (
        listed
        | set(running.get("recently_completed_ids", []))
        | set(running.get("pending_ids", []))
    )


def chat_context(body: Mapping[str, Any]) -> tuple[uuid.UUID, int, int]:
    """chat_execution_service.py: the session's id (a UUID), its fill and its size."""
    session = body["session"]
    return (
        uuid.UUID(session["session_id"]),
        int(session["context_tokens"]),
        int(session["context_window"]),
    )

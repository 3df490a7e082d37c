"""The contract's fixed messages, which a controller matches (contract §7).

A container fault and an auth refusal both travel as 503 to a legacy reader: the
message is what tells them apart, so both halves spell it here, once.
"""

from __future__ import annotations

UNAVAILABLE_MESSAGE = "Claude Code is not available in this container"
"""Row 1's exact message for a missing runtime, whatever the runtime."""
BYPASS_REFUSED_PREFIX = "Permission bypass failed"
"""Row 1's message for a permission mode the CLI refuses starts with this."""


def bypass_refused(detail: str) -> str:
    """Row 1's message for a refused permission mode."""
    return f"{BYPASS_REFUSED_PREFIX}: {detail}"


def is_container_fault(message: str) -> bool:
    """True when a 503's message is a container fault, not an auth refusal."""
    lowered = message.lower()
    return any(m.lower() in lowered for m in (UNAVAILABLE_MESSAGE, BYPASS_REFUSED_PREFIX))

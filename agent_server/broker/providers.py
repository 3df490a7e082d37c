"""Each API the broker stands in for: the header its key travels in, and its home (§4.8).

Pure data. A placeholder keeps the shape of the key it stands for (its prefix), so
a CLI that checks a key's shape takes it as it would the real one. A key-only API
(OpenAI's, Gemini's) has one header for a key and a gateway's token alike; the
Messages API takes a key in `x-api-key` and a token or subscription as a bearer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

CredentialHeader = Literal["authorization", "x-api-key", "x-goog-api-key"]
"""How the real credential reaches the API: `Authorization: Bearer …`, or a key header."""


@dataclass(frozen=True)
class Provider:
    """One API as the broker reaches it."""

    key_header: CredentialHeader
    """The header an API key travels in."""
    gateway_header: CredentialHeader
    """The header a gateway's token (`auth_override.provider`) travels in."""
    key_shape: str
    """The prefix of the API's keys, which a key's placeholder starts with."""
    upstream: str
    """Where the CLI sends its requests when no base URL is set (no trailing slash)."""


PROVIDERS: Mapping[str, Provider] = MappingProxyType(
    {
        "anthropic": Provider(
            "x-api-key", "authorization", "sk-ant-api03-", "https://api.anthropic.com"
        ),
        "openai": Provider(
            "authorization", "authorization", "sk-proj-", "https://api.openai.com/v1"
        ),
        "gemini": Provider(
            "x-goog-api-key",
            "x-goog-api-key",
            "AIza",
            "https://generativelanguage.googleapis.com",
        ),
    }
)
"""By `names.Api`."""

"""The names every layer agrees on: environment variables, headers, spawn layers,
override kinds, auth routes and outcome kinds.

One home for each: the spawn env builder, the credential state and its guards, the
status report, the classifier, the wire schemas and the metrics all read them here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Literal, get_args

CLAUDE_OAUTH = "CLAUDE_CODE_OAUTH_TOKEN"
API_KEY = "ANTHROPIC_API_KEY"
AUTH_TOKEN = "ANTHROPIC_AUTH_TOKEN"  # noqa: S105 - a variable name
BASE_URL = "ANTHROPIC_BASE_URL"
PROVIDER_SWITCHES = ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")
SUBSCRIPTION_SHADOW_KEYS = (API_KEY, AUTH_TOKEN, *PROVIDER_SWITCHES)
"""The names Claude Code prefers over `CLAUDE_CODE_OAUTH_TOKEN` (the recorded transcripts)."""
CLAUDE_CREDENTIALS = (API_KEY, AUTH_TOKEN, CLAUDE_OAUTH)
"""In the order the CLI prefers them (`apiKeySource` reports the first)."""

OPENAI_KEY = "OPENAI_API_KEY"
CODEX_KEY = "CODEX_API_KEY"
OPENAI_BASE_URL = "OPENAI_BASE_URL"
GEMINI_KEY = "GEMINI_API_KEY"
GOOGLE_KEY = "GOOGLE_API_KEY"
GEMINI_BASE_URL = "GOOGLE_GEMINI_BASE_URL"
GEMINI_SWITCHES = ("GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA")
"""Gemini CLI's choices of another auth than an API key (Vertex AI, a Google login)."""

Api = Literal["anthropic", "openai", "gemini"]
"""The API a runtime's CLI talks to, and so how the broker stands in for its credential."""


@dataclass(frozen=True)
class ApiNames:
    """The variables by which a CLI finds one API's key and its base URL."""

    keys: tuple[str, ...]
    """The key variables, the one the CLI prefers first."""
    base_url: str
    switches: tuple[str, ...] = ()
    """Variables that, set true, take the CLI to an auth it signs for itself."""


KEY_APIS: Mapping[str, ApiNames] = MappingProxyType(
    {
        "openai": ApiNames((OPENAI_KEY, CODEX_KEY), OPENAI_BASE_URL),
        "gemini": ApiNames((GEMINI_KEY, GOOGLE_KEY), GEMINI_BASE_URL, GEMINI_SWITCHES),
    }
)
"""The APIs a CLI authenticates to with a plain API key (Claude's names are above)."""

ROUTING_VARS = frozenset(
    {
        BASE_URL,
        "ANTHROPIC_BEDROCK_BASE_URL",
        "ANTHROPIC_VERTEX_BASE_URL",
        "ANTHROPIC_FOUNDRY_BASE_URL",
        "ANTHROPIC_FOUNDRY_RESOURCE",
        *PROVIDER_SWITCHES,
        *(f"{name}_PROXY" for name in ("HTTPS", "HTTP", "ALL", "NO")),
        *(f"{name}_proxy" for name in ("https", "http", "all", "no")),
        "NODE_EXTRA_CA_CERTS",
        "NODE_TLS_REJECT_UNAUTHORIZED",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        # Where Claude Code reads its settings, whose `env` and `apiKeyHelper` outrank ours.
        "CLAUDE_CONFIG_DIR",
    }
)
"""Where a spawn's requests go and whom its TLS trusts: a credential's route (contract §4.6)."""

DESCRIPTOR_SUFFIX = "_FILE_DESCRIPTOR"
"""`CLAUDE_CODE_OAUTH_TOKEN_FILE_DESCRIPTOR=N`: the CLI reads that credential from fd N.
Only the server hands descriptors out: no layer below the spawn may name one."""
CLAUDE_DESCRIPTORS = {
    CLAUDE_OAUTH: "CLAUDE_CODE_OAUTH_TOKEN" + DESCRIPTOR_SUFFIX,
    API_KEY: "CLAUDE_CODE_API_KEY" + DESCRIPTOR_SUFFIX,
}
"""The credentials Claude Code takes from a descriptor, and the variable naming it.
`ANTHROPIC_AUTH_TOKEN` is not among them: 2.1.328's gateway-token descriptor serves its
own gateway mode only and never becomes the bearer sent to `ANTHROPIC_BASE_URL`."""

CONTROLLER_TOKEN = "TRINITY_AGENT_AUTH_TOKEN"  # noqa: S105 - a variable name
EXECUTION_ID = "TRINITY_EXECUTION_ID"

BYPASS_PERMISSIONS = "bypassPermissions"
"""The default permission mode: no tool call waits for an approval (contract §1)."""

CONTROLLER_TOKEN_HEADER = "X-Trinity-Agent-Token"  # noqa: S105 - a header name
AUTH_OVERRIDE_HEADER = "X-Trinity-Auth-Override"
CALLBACK_SIGNATURE_HEADER = "X-Agent-Server-Signature"
"""`t=<unix time>,v1=<hex>`: HMAC-SHA256 of `<t>.<body>` under the callback key (§6.8)."""
CALLBACK_KEY_LABEL = b"agent-server callback signature v1"
"""The callback key is HMAC-SHA256 of this label under the controller token."""
AUTHENTICATED_CONNECTION = "agent_server.authenticated_connection"
"""The ASGI scope extension whose `mark()` tells the connection guard that a request on
this connection carried the controller token (contract §8, Slow clients)."""

Layer = Literal["baseline", "env_file", "override", "per_spawn"]
"""Where a spawn's variable came from (contract §4.2)."""

AuthOverrideKind = Literal["oauth_token", "api_key", "provider"]
AUTH_OVERRIDE_KINDS: tuple[AuthOverrideKind, ...] = get_args(AuthOverrideKind)
AuthRoute = Literal["baseline", AuthOverrideKind]
"""Which credential served a turn: the baseline, or the kind of its override."""


class OutcomeKind(StrEnum):
    """How a turn ended: the rows of the outcome table (contract §7), plus success."""

    SUCCESS = "success"
    CANCELLED = "cancelled"
    CONTAINER_FAULT = "container_fault"
    TIMEOUT = "timeout"
    KILLED = "killed"
    MODEL_UNSUPPORTED = "model_unsupported"
    RATE_LIMIT = "rate_limit"
    BILLING = "billing"
    AUTH = "auth"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    MAX_TURNS = "max_turns"
    EXECUTION_ERROR = "execution_error"


# `.env` must never redirect what a spawn executes or loads: exec hooks and loaders.
_PROTECTED_EXACT = frozenset(
    {"PATH", "HOME", "NODE_OPTIONS", "BASH_ENV", "ENV", "IFS", "SHELL", CONTROLLER_TOKEN}
)
_PROTECTED_PATTERN = re.compile(
    r"^(LD_.*|PYTHON.*|AGENT_SERVER_.*|GIT_(SSH|SSH_COMMAND|EXEC_PATH|EDITOR|SEQUENCE_EDITOR"
    r"|PAGER|ASKPASS|PROXY_COMMAND|EXTERNAL_DIFF|TEMPLATE_DIR|CONFIG.*))$"
)
_CREDENTIAL_SUFFIXES = ("_API_KEY", "_TOKEN", "_SECRET", "_PASSWORD")


def is_server_only(name: str) -> bool:
    """The server's own secret and settings, and credential descriptors (which only the
    server hands out, contract §4.7): no spawn receives them from the baseline."""
    return (
        name == CONTROLLER_TOKEN
        or name.startswith("AGENT_SERVER_")
        or name.endswith(DESCRIPTOR_SUFFIX)
    )


@functools.lru_cache(maxsize=16384)
def is_protected(name: str) -> bool:
    """Names `.env` may not set (contract §4.2): loaders, exec hooks, the server's own."""
    return (
        name in _PROTECTED_EXACT
        or name.endswith(DESCRIPTOR_SUFFIX)
        or _PROTECTED_PATTERN.match(name) is not None
    )


@functools.lru_cache(maxsize=16384)
def is_credential_name(name: str) -> bool:
    """A variable whose value is a secret (the redactor's list, contract §8)."""
    return name in CLAUDE_CREDENTIALS or name.endswith(_CREDENTIAL_SUFFIXES)


WINDOW_LENGTHS: Mapping[str, timedelta] = MappingProxyType(
    {
        "five_hour": timedelta(hours=5),
        "seven_day": timedelta(days=7),
        "seven_day_opus": timedelta(days=7),
        "seven_day_sonnet": timedelta(days=7),
    }
)
"""How long each provider rate-limit window is: its reset is never further away. The
broker bounds a refusal's reset by it, the controller a remembered wall."""
LONGEST_WINDOW = timedelta(days=7)
"""The bound of a reset whose window is not named (or not known)."""

"""A credential's route is part of the credential (contract §4.6).

Where a spawn's requests go (`ANTHROPIC_BASE_URL`, the Bedrock/Vertex/Foundry
switches and endpoints, proxies, the TLS trust store: `names.ROUTING_VARS`) decides
who receives its credential. The baseline can hold two kinds of endpoint:

- an **endpoint pin**: `ANTHROPIC_BASE_URL` with no credential of the baseline's own
  (an egress proxy to Anthropic, a loopback stand-in). It applies to every credential;
- a **gateway**: the baseline pairs `ANTHROPIC_BASE_URL` with `ANTHROPIC_AUTH_TOKEN`
  or `ANTHROPIC_API_KEY`. The URL belongs to that credential only.

`guard_route` applies two rules to a built environment, after the five layers:

1. a credential that did not come from `.env` is never routed by `.env` (the agent
   writes it): every routing variable `.env` supplied falls back to the baseline's
   value, or goes;
2. a gateway URL carries only the gateway's own credential: with any other one the
   URL goes (Anthropic's default endpoint serves it), and the gateway's spawn does
   not carry the subscription token beside its own.

Rule 1 holds for a key-only API's base URL too (`OPENAI_BASE_URL`,
`GOOGLE_GEMINI_BASE_URL`, `names.KEY_APIS`): `.env` routes only a key `.env` set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent_server.wire.names import (
    API_KEY,
    AUTH_TOKEN,
    BASE_URL,
    CLAUDE_CREDENTIALS,
    CLAUDE_OAUTH,
    KEY_APIS,
    PROVIDER_SWITCHES,
    ROUTING_VARS,
    Layer,
)

_TRUTHY = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Credential:
    """The variable a spawn authenticates with, and the layer it came from."""

    variable: str
    layer: Layer
    others: tuple[str, ...]
    """The other credential names (and switches) the spawn also carries."""


def effective_credential(env: Mapping[str, str], sources: Mapping[str, Layer]) -> Credential | None:
    """What Claude Code authenticates with, by its own precedence (the recorded transcripts).

    A provider switch wins over every credential; then `ANTHROPIC_API_KEY` (what the
    CLI reports as `apiKeySource`), `ANTHROPIC_AUTH_TOKEN`, `CLAUDE_CODE_OAUTH_TOKEN`.
    """
    carried = [name for name in CLAUDE_CREDENTIALS if env.get(name)]
    switches = [name for name in PROVIDER_SWITCHES if env.get(name, "").lower() in _TRUTHY]
    ranked = switches + carried
    if not ranked:
        return None
    return Credential(ranked[0], sources[ranked[0]], tuple(ranked[1:]))


def guard_route(
    baseline: Mapping[str, str], env: dict[str, str], sources: dict[str, Layer]
) -> frozenset[str]:
    """Apply both rules to `env`/`sources` in place; return the `.env` names they overrode."""
    rerouted = _guard_key_routes(baseline, env, sources)
    credential = effective_credential(env, sources)
    if credential is None:
        return frozenset(rerouted)
    if credential.layer != "env_file":
        for name in ROUTING_VARS:
            if sources.get(name) != "env_file":
                continue
            rerouted.add(name)
            if name in baseline:
                env[name], sources[name] = baseline[name], "baseline"
            else:
                del env[name], sources[name]
    gateway = _gateway(baseline)
    if gateway is not None and env.get(BASE_URL) == gateway and sources[BASE_URL] != "per_spawn":
        if _owns_gateway(credential, env, baseline):
            env.pop(CLAUDE_OAUTH, None)
            sources.pop(CLAUDE_OAUTH, None)
        else:
            del env[BASE_URL], sources[BASE_URL]
    return frozenset(rerouted)


def _guard_key_routes(
    baseline: Mapping[str, str], env: dict[str, str], sources: dict[str, Layer]
) -> set[str]:
    """Rule 1 for each key-only API: a base URL from `.env` falls back to the baseline's
    (or goes) when the key the CLI reads first is the server's (not `.env`'s)."""
    rerouted = set()
    for names in KEY_APIS.values():
        name = names.base_url
        if sources.get(name) != "env_file":
            continue
        key = next((variable for variable in names.keys if env.get(variable)), None)
        if key is None or sources.get(key) == "env_file":
            continue  # no key of the server's goes there
        rerouted.add(name)
        if name in baseline:
            env[name], sources[name] = baseline[name], "baseline"
        else:
            del env[name], sources[name]
    return rerouted


def _gateway(baseline: Mapping[str, str]) -> str | None:
    """The baseline's gateway URL, when it pairs one with a credential of its own."""
    url = baseline.get(BASE_URL, "").strip()
    paired = baseline.get(AUTH_TOKEN, "").strip() or baseline.get(API_KEY, "").strip()
    return baseline[BASE_URL] if url and paired else None


def _owns_gateway(
    credential: Credential, env: Mapping[str, str], baseline: Mapping[str, str]
) -> bool:
    """True when the spawn authenticates with the gateway's own baseline credential."""
    variable = credential.variable
    return variable in (AUTH_TOKEN, API_KEY) and env.get(variable) == baseline.get(variable)

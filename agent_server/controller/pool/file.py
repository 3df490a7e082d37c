"""The pool file (TOML): the credentials a controller walks, and where their secrets are.

    [[credential]]
    id = "sub-a"
    kind = "subscription"          # subscription | api_key | gateway
    secret_env = "SUB_A_TOKEN"     # or secret_file = "/run/secrets/sub-a"

    [[credential]]
    id = "gateway"
    kind = "gateway"
    base_url = "https://gateway.example/anthropic"
    model = "claude-sonnet-4-5"    # optional
    secret_file = "/run/secrets/gateway"
    max_concurrent_turns = 4       # optional: this credential's ceiling across the fleet

    [limits]                       # optional
    max_concurrent_turns = 1       # every other credential's ceiling (none: no ceiling)
    probe_spacing_seconds = 60     # at least this long between probes of one credential

    [agent.ci-bot]
    api_key = false                # this agent never falls back to the platform key
    url = "http://ci-bot:8000"     # its agent-server (for `pool serve`), with
    token_file = "/run/secrets/ci-bot"  # the controller token it takes (and sends back
                                   # as its heartbeat's bearer)

A secret is never written in the file: `secret = …` is refused. At most one `api_key`
and one `gateway`; ids are unique. Every error names the entry and the key, never a
value. A controller that keeps its credentials elsewhere (a database) builds the same
pool in code with `build_pool`, which checks it the same way.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from agent_server.controller.errors import PoolFileError
from agent_server.controller.pool.state import CREDENTIAL_KINDS, CredentialInfo, CredentialKind
from agent_server.wire.fingerprint import fingerprint
from agent_server.wire.turns import AuthOverride, ProviderOverride
from agent_server.wire.values import check_url, secret_problem

CREDENTIAL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CREDENTIAL_KEYS = frozenset(
    {"id", "kind", "secret_env", "secret_file", "base_url", "model", "max_concurrent_turns"}
)
_AGENT_KEYS = frozenset({"api_key", "url", "token_file"})
_LIMIT_KEYS = frozenset({"max_concurrent_turns", "probe_spacing_seconds"})
DEFAULT_PROBE_SPACING_SECONDS = 60
"""Probes of one credential at most once a minute unless the pool file says otherwise."""


@dataclass(frozen=True)
class PoolCredential:
    """One credential of the pool, its secret read from where the file said."""

    id: str
    kind: CredentialKind
    secret: SecretStr = field(repr=False)
    base_url: str | None = None
    model: str | None = None
    max_concurrent_turns: int | None = None
    """This credential's ceiling of turns in flight across the fleet (None: the pool's)."""

    @property
    def info(self) -> CredentialInfo:
        """What a store may know of it."""
        return CredentialInfo(self.id, self.kind)

    def override(self) -> AuthOverride:
        """The `auth_override` that runs one spawn on this credential (contract §6.2)."""
        if self.kind == "subscription":
            return AuthOverride(oauth_token=self.secret)
        if self.kind == "api_key":
            return AuthOverride(api_key=self.secret)
        provider = ProviderOverride(
            base_url=self.base_url or "", auth_token=self.secret, model=self.model
        )
        return AuthOverride(provider=provider)


@dataclass(frozen=True)
class PoolAgent:
    """An agent the pool file names with its server: where `pool serve` reaches it."""

    name: str
    url: str
    token: SecretStr = field(repr=False)
    """Its controller token: sent to its server, and the bearer of its heartbeat."""


@dataclass(frozen=True)
class Pool:
    """The credentials in file order, and each agent's opt-outs."""

    credentials: tuple[PoolCredential, ...]
    api_key_opt_outs: frozenset[str] = frozenset()
    """Agents that never fall back to the platform API key."""
    max_concurrent_turns: int | None = None
    """The ceiling of a credential that names none (None: no ceiling)."""
    probe_spacing_seconds: float = DEFAULT_PROBE_SPACING_SECONDS
    """The least time between two probes of one credential."""
    agents: Mapping[str, PoolAgent] = field(default_factory=dict)
    """The agents named with a `url` and `token_file`, by name."""
    _by_id: dict[str, PoolCredential] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {c.id: c for c in self.credentials})

    def ceiling(self, credential_id: str) -> int | None:
        """The credential's ceiling of concurrent turns: its own, else the pool's."""
        found = self._by_id.get(credential_id)
        own = found.max_concurrent_turns if found is not None else None
        return own if own is not None else self.max_concurrent_turns

    def get(self, credential_id: str) -> PoolCredential | None:
        """The credential with this id, if the pool has it."""
        return self._by_id.get(credential_id)

    @property
    def subscriptions(self) -> tuple[PoolCredential, ...]:
        """The subscriptions, in file order."""
        return tuple(c for c in self.credentials if c.kind == "subscription")

    def credential(self, credential_id: str) -> PoolCredential:
        """The credential with this id; `PoolFileError` when the pool has none."""
        found = self._by_id.get(credential_id)
        if found is None:
            msg = f"{credential_id!r} is not in the pool"
            raise PoolFileError(msg)
        return found

    def by_fingerprint(self, said: str) -> PoolCredential | None:
        """The credential whose secret has this fingerprint (what a server reports)."""
        return self._fingerprints.get(said)

    @cached_property
    def _fingerprints(self) -> dict[str, PoolCredential]:
        return {fingerprint(c.secret): c for c in self.credentials}

    @cached_property  # the walk reads it on every rung; a pool may hold a thousand
    def infos(self) -> tuple[CredentialInfo, ...]:
        """Every credential's id and kind, in file order."""
        return tuple(c.info for c in self.credentials)


def load_pool(path: Path, environ: Mapping[str, str] | None = None) -> Pool:
    """Read and check the pool file; secrets from `environ` (the process's by default)."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        msg = f"pool file {path}: {exc.strerror or exc}"
        raise PoolFileError(msg) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        msg = f"pool file {path} is not TOML: {exc}"
        raise PoolFileError(msg) from exc
    return parse_pool(document, os.environ if environ is None else environ, path.parent)


def parse_pool(document: Mapping[str, Any], environ: Mapping[str, str], base: Path) -> Pool:
    """A pool from a parsed document; relative `secret_file` paths are read under `base`."""
    unknown = set(document) - {"credential", "agent", "limits"}
    if unknown:
        msg = f"pool file: unknown tables {sorted(unknown)} (credential, agent, limits)"
        raise PoolFileError(msg)
    entries = document.get("credential")
    if not isinstance(entries, list) or not entries:
        msg = "pool file: no [[credential]] entries"
        raise PoolFileError(msg)
    credentials = tuple(_credential(n, e, environ, base) for n, e in enumerate(entries, 1))
    tables = _agent_tables(document.get("agent", {}))
    pool = _checked(credentials, _opt_outs(tables), "pool file")
    pool = _with_limits(pool, document.get("limits", {}))
    agents = {name: a for name, t in tables.items() if (a := _agent(name, t, base)) is not None}
    return replace(pool, agents=agents)


def _with_limits(pool: Pool, limits: object) -> Pool:
    """The pool with the `[limits]` table's ceiling and probe spacing."""
    if not isinstance(limits, dict) or set(limits) - _LIMIT_KEYS:
        msg = f"pool file: [limits] takes only {', '.join(sorted(_LIMIT_KEYS))}"
        raise PoolFileError(msg)
    ceiling = _ceiling("pool file: [limits]", limits.get("max_concurrent_turns"))
    spacing = limits.get("probe_spacing_seconds", DEFAULT_PROBE_SPACING_SECONDS)
    # `not >= 0` refuses NaN too
    if isinstance(spacing, bool) or not isinstance(spacing, int | float) or not spacing >= 0:
        msg = "pool file: [limits] probe_spacing_seconds must be a number of seconds, 0 or more"
        raise PoolFileError(msg)
    return Pool(pool.credentials, pool.api_key_opt_outs, ceiling, float(spacing))


def _ceiling(where: str, value: object) -> int | None:
    """A ceiling of concurrent turns: absent, or a whole number of at least 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{where}: max_concurrent_turns must be a whole number of at least 1"
        raise PoolFileError(msg)
    return value


def build_pool(
    credentials: Iterable[PoolCredential], *, api_key_opt_outs: Iterable[str] = ()
) -> Pool:
    """A pool built in code (from a database, a secret manager), checked as the pool file
    is: each id, kind, gateway URL and secret, unique ids, a subscription, at most one
    key and one gateway, agent names. `PoolFileError` names the entry, never a value."""
    credentials = tuple(credentials)
    for credential in credentials:
        where = f"pool: credential {credential.id!r}"
        if not isinstance(credential.id, str) or not CREDENTIAL_ID.fullmatch(credential.id):
            msg = f"pool: credential id must match {CREDENTIAL_ID.pattern}"
            raise PoolFileError(msg)
        _check_entry(where, credential.kind, credential.base_url, credential.model)
        _ceiling(where, credential.max_concurrent_turns)
        if not isinstance(credential.secret, SecretStr):
            msg = f"{where}: the secret must be a SecretStr"
            raise PoolFileError(msg)
        problem = secret_problem(credential.secret.get_secret_value())
        if problem is not None:
            msg = f"{where}: the secret {problem}"
            raise PoolFileError(msg)
    opt_outs = frozenset(api_key_opt_outs)
    for name in sorted(opt_outs):
        if not isinstance(name, str) or not AGENT_NAME.fullmatch(name):
            msg = f"pool: agent {name!r} must be named like {AGENT_NAME.pattern}"
            raise PoolFileError(msg)
    return _checked(credentials, opt_outs, "pool")


def _checked(credentials: tuple[PoolCredential, ...], opt_outs: frozenset[str], where: str) -> Pool:
    """The checks of the pool as a whole, for a file and a pool built in code alike."""
    if not credentials:
        msg = f"{where}: no credentials"
        raise PoolFileError(msg)
    ids = [c.id for c in credentials]
    if len(set(ids)) != len(ids):
        msg = f"{where}: duplicate credential ids {sorted({i for i in ids if ids.count(i) > 1})}"
        raise PoolFileError(msg)
    if not any(c.kind == "subscription" for c in credentials):
        msg = f"{where}: no subscription (an agent is assigned one)"
        raise PoolFileError(msg)
    for kind in ("api_key", "gateway"):
        if sum(c.kind == kind for c in credentials) > 1:
            msg = f"{where}: more than one {kind} (the walk has one {kind} rung)"
            raise PoolFileError(msg)
    return Pool(credentials, opt_outs)


def _credential(
    number: int, entry: object, environ: Mapping[str, str], base: Path
) -> PoolCredential:
    where = f"pool file: credential #{number}"
    if not isinstance(entry, dict):
        msg = f"{where} is not a table"
        raise PoolFileError(msg)
    if "secret" in entry:
        msg = f"{where}: an inline secret is refused; use secret_env or secret_file"
        raise PoolFileError(msg)
    unknown = set(entry) - _CREDENTIAL_KEYS
    if unknown:
        msg = f"{where}: unknown keys {sorted(unknown)}"
        raise PoolFileError(msg)
    ident, kind = entry.get("id"), entry.get("kind")
    if not isinstance(ident, str) or not CREDENTIAL_ID.fullmatch(ident):
        msg = f"{where}: id must match {CREDENTIAL_ID.pattern}"
        raise PoolFileError(msg)
    where = f"pool file: credential {ident!r}"
    base_url, model = entry.get("base_url"), entry.get("model")
    checked = _check_entry(where, kind, base_url, model)
    secret = _secret(where, entry, environ, base)
    ceiling = _ceiling(where, entry.get("max_concurrent_turns"))
    return PoolCredential(ident, checked, secret, base_url, model, ceiling)


def _check_entry(where: str, kind: object, base_url: object, model: object) -> CredentialKind:
    """A credential's kind, and a gateway's URL and model (which only a gateway has)."""
    checked = next((known for known in CREDENTIAL_KINDS if known == kind), None)
    if checked is None:
        msg = f"{where}: kind must be one of {', '.join(CREDENTIAL_KINDS)}"
        raise PoolFileError(msg)
    if checked == "gateway":
        _check_gateway(where, base_url, model)
    elif base_url is not None or model is not None:
        msg = f"{where}: base_url and model belong to a gateway"
        raise PoolFileError(msg)
    return checked


def _check_gateway(where: str, base_url: object, model: object) -> None:
    try:
        check_url(base_url if isinstance(base_url, str) else "")
    except ValueError as exc:
        msg = f"{where}: base_url {exc}"
        raise PoolFileError(msg) from exc
    if model is not None and not isinstance(model, str):
        msg = f"{where}: model must be a string"
        raise PoolFileError(msg)


def _secret(where: str, entry: dict[str, Any], environ: Mapping[str, str], base: Path) -> SecretStr:
    """The secret from `secret_env` or `secret_file` (exactly one), checked as a token."""
    name, file = entry.get("secret_env"), entry.get("secret_file")
    if (name is None) == (file is None):
        msg = f"{where}: give exactly one of secret_env or secret_file"
        raise PoolFileError(msg)
    if isinstance(name, str):
        if name not in environ:
            msg = f"{where}: secret_env {name} is not set"
            raise PoolFileError(msg)
        value = environ[name].strip()
        source = f"secret_env {name}"
    elif isinstance(file, str):
        try:
            value = (base / file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            msg = f"{where}: secret_file {file} cannot be read ({type(exc).__name__})"
            raise PoolFileError(msg) from exc
        source = f"secret_file {file}"
    else:
        msg = f"{where}: secret_env and secret_file are strings"
        raise PoolFileError(msg)
    problem = secret_problem(value)
    if problem is not None:
        msg = f"{where}: the secret in {source} {problem}"
        raise PoolFileError(msg)
    return SecretStr(value)


def _agent_tables(agents: object) -> dict[str, dict[str, Any]]:
    """The `[agent.NAME]` tables, each named well and holding only known keys."""
    if not isinstance(agents, dict):
        msg = "pool file: [agent.NAME] tables expected"
        raise PoolFileError(msg)
    for name, policy in agents.items():
        if not AGENT_NAME.fullmatch(name) or not isinstance(policy, dict):
            msg = f"pool file: agent {name!r} must be a table named like {AGENT_NAME.pattern}"
            raise PoolFileError(msg)
        unknown = set(policy) - _AGENT_KEYS
        if unknown:
            msg = f"pool file: agent {name!r} takes only {', '.join(sorted(_AGENT_KEYS))}"
            raise PoolFileError(msg)
        if not isinstance(policy.get("api_key", True), bool):
            msg = f"pool file: agent {name!r}: api_key must be true or false"
            raise PoolFileError(msg)
    return agents


def _opt_outs(tables: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    return frozenset(name for name, policy in tables.items() if policy.get("api_key") is False)


def _agent(name: str, table: Mapping[str, Any], base: Path) -> PoolAgent | None:
    """The agent's server (`url`) and controller token (`token_file`): both or neither."""
    where = f"pool file: agent {name!r}"
    url, file = table.get("url"), table.get("token_file")
    if url is None and file is None:
        return None
    if not isinstance(url, str) or not isinstance(file, str):
        msg = f"{where}: give both url and token_file, as strings"
        raise PoolFileError(msg)
    try:
        check_url(url)
    except ValueError as exc:
        msg = f"{where}: url {exc}"
        raise PoolFileError(msg) from exc
    try:
        value = (base / file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"{where}: token_file {file} cannot be read ({type(exc).__name__})"
        raise PoolFileError(msg) from exc
    problem = secret_problem(value)
    if problem is not None:
        msg = f"{where}: the token in token_file {file} {problem}"
        raise PoolFileError(msg)
    return PoolAgent(name, url.rstrip("/"), SecretStr(value))

"""The REAL Codex and Gemini CLIs through the broker, against their API stand-ins (§4.8, §7).

Each request a stand-in receives is captured whole (the key only as its fingerprint),
with the environment of every process of a turn alive at that moment, so a turn
through the broker is compared field by field with the same turn whose CLI held the
key itself, and no spawn is seen holding a key. These tests FAIL under CI when a CLI
is missing (`RealCli.require`), they never skip there.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.api_stand_in import fingerprint
from tests.support.gemini_api import MODEL as GEMINI_MODEL
from tests.support.gemini_api import GeminiApiStandIn
from tests.support.openai_api import ResponsesApiStandIn
from tests.support.real_clis import CODEX, GEMINI
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(120)]

OVERRIDE_HEADER = "x-trinity-auth-override"
_KEY_HEADERS = ("authorization", "x-goog-api-key")
_PER_RUN_ID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|_unix_ms\\\":\d+"
)
"""A uuid (a session's, a message's) or a turn's start in ms: new in each run of a CLI."""
_TURN_MARK = b"TRINITY_EXECUTION_ID="


@dataclass(frozen=True)
class Captured:
    """One request as a stand-in received it (keys as fingerprints), and the environment
    of each process of a turn alive while it waited for its answer."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    environs: tuple[bytes, ...]


def turn_environs() -> tuple[bytes, ...]:
    """The environment of every process that carries a turn's execution id."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if _TURN_MARK in environ:
                found.append(environ)
    return tuple(found)


async def capture(request: Request, into: list[Captured], lock: threading.Lock) -> None:
    """Keep `request` whole, its key as a fingerprint."""
    headers = {}
    for name, value in request.headers.items():
        if name in _KEY_HEADERS:
            value = "fp:" + fingerprint(value.removeprefix("Bearer "))
        headers[name] = value
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        body = raw.decode(errors="replace")
    query = request.url.query
    captured = Captured(request.method, request.url.path, query, headers, body, turn_environs())
    with lock:
        into.append(captured)


class CapturingResponses(ResponsesApiStandIn):
    """The Responses API stand-in, also keeping every request whole."""

    def __init__(self) -> None:
        super().__init__()
        self.captured: list[Captured] = []
        self._capture_lock = threading.Lock()

    async def _responses(self, request: Request) -> Response:
        await capture(request, self.captured, self._capture_lock)
        return await super()._responses(request)


class CapturingGemini(GeminiApiStandIn):
    """The Gemini API stand-in, also keeping every request whole."""

    def __init__(self) -> None:
        super().__init__()
        self.captured: list[Captured] = []
        self._capture_lock = threading.Lock()

    async def _generate(self, request: Request) -> Response:
        await capture(request, self.captured, self._capture_lock)
        return await super()._generate(request)


Api = CapturingResponses | CapturingGemini


@pytest.fixture(scope="module")
def openai() -> Iterator[CapturingResponses]:
    """The Responses API, for the module."""
    with CapturingResponses() as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
def gemini() -> Iterator[CapturingGemini]:
    """The Gemini API, for the module."""
    with CapturingGemini() as stand_in:
        yield stand_in


def start(
    servers: TurnServers, runtime: str, api: Api, name: str, key: str, **extra: str
) -> ServerProcess:
    """A server running the real `runtime` against `api` with baseline `key`. The servers
    of one runtime share a HOME and workdir, so the CLI's requests hold the same paths."""
    shared = servers.home(f"shared-{runtime}")
    (shared / "work").mkdir(exist_ok=True)
    env = {
        "HOME": str(shared),
        "AGENT_SERVER_WORKDIR": str(shared / "work"),
        "AGENT_RUNTIME": runtime,
        "TZ": "UTC",
        **extra,
    }
    if isinstance(api, CapturingResponses):
        env["AGENT_SERVER_RUNTIME_COMMAND"] = str(CODEX.require())
        env["CODEX_HOME"] = str(api.write_codex_home(shared / "codex-home"))
        # Codex reads no base URL from its environment: this one is the broker's upstream.
        env["OPENAI_BASE_URL"] = api.base_url + "/v1"
        env["OPENAI_API_KEY"] = key
    else:
        env["AGENT_SERVER_RUNTIME_COMMAND"] = str(GEMINI.require())
        env["GOOGLE_GEMINI_BASE_URL"] = api.base_url
        env["GEMINI_API_KEY"] = key
    return servers.start(servers.home(name), **env)


@pytest.fixture(scope="module")
def servers(
    module_turn_servers: TurnServers,
    secret_registry: SecretRegistry,
    openai: CapturingResponses,
    gemini: CapturingGemini,
) -> dict[str, ServerProcess]:
    """A brokered and a direct server of each runtime."""
    started = {}
    for runtime, api in (("codex", openai), ("gemini-cli", gemini)):
        for mode in ("brokered", "direct"):
            key = secret_registry.new(f"{runtime}_{mode}_baseline".replace("-", ""))
            extra = {"AGENT_SERVER_BROKER": "1" if mode == "brokered" else "0"}
            name = f"{runtime}-{mode}"
            started[name] = start(module_turn_servers, runtime, api, name, key, **extra)
    return started


def post(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    """One turn, with the controller token."""
    with server.client(timeout=100) as client:
        return client.post("/api/task", json={"timeout_seconds": 60, **body})


def turn(
    api: Api, server: ServerProcess, body: dict[str, Any]
) -> tuple[httpx.Response, list[Captured]]:
    """Run one turn; the requests it made to the stand-in."""
    if server.environ["AGENT_RUNTIME"] == "gemini-cli":
        body = {"model": GEMINI_MODEL, **body}
    before = len(api.captured)
    response = post(server, body)
    return response, api.captured[before:]


def comparable(captured: Captured) -> dict[str, Any]:
    """A request without what differs between any two runs: the port, and every id the
    CLI makes per run (its session's, its messages')."""
    headers = {k: v for k, v in captured.headers.items() if k != "host"}
    headers = json.loads(_PER_RUN_ID.sub("<id>", json.dumps(headers)))
    body = json.loads(_PER_RUN_ID.sub("<id>", json.dumps(captured.body)))
    return {
        "method": captured.method,
        "path": captured.path,
        "query": captured.query,
        "headers": headers,
        "body": body,
    }


RUNTIMES = [("codex", "openai"), ("gemini-cli", "gemini")]


@pytest.fixture(name="api_of")
def api_of_fixture(openai: CapturingResponses, gemini: CapturingGemini) -> dict[str, Api]:
    """Each stand-in by its fixture's name."""
    return {"openai": openai, "gemini": gemini}


@pytest.mark.parametrize(("runtime", "api_name"), RUNTIMES)
def test_the_upstream_request_is_the_one_the_cli_sends_with_the_key_itself(
    servers: dict[str, ServerProcess],
    api_of: dict[str, Api],
    secret_registry: SecretRegistry,
    runtime: str,
    api_name: str,
) -> None:
    """Method, path, query, every header and the body match field by field, but the
    key: the broker's is the override, in the CLI's own header."""
    api = api_of[api_name]
    secret = secret_registry.new(f"broker_same_{api_name}")
    body = {"message": "the same turn", "auth_override": {"api_key": secret}}
    through_answer, through = turn(api, servers[f"{runtime}-brokered"], body)
    direct_body = {"message": "the same turn"}
    held_answer, held = turn(api, servers[f"{runtime}-direct"], direct_body)
    assert through_answer.status_code == 200, through_answer.text
    assert held_answer.status_code == 200, held_answer.text
    assert through_answer.headers[OVERRIDE_HEADER] == "api_key"
    assert len(through) == len(held) >= 1
    key_header = "authorization" if api_name == "openai" else "x-goog-api-key"
    for got_request, held_request in zip(through, held, strict=True):
        got, expected = comparable(got_request), comparable(held_request)
        for field in ("method", "path", "query", "body"):
            assert got[field] == expected[field], field
        for name in sorted(set(expected["headers"]) | set(got["headers"])):
            if name == key_header:
                continue
            assert got["headers"].get(name) == expected["headers"].get(name), name
        assert got["headers"][key_header] == "fp:" + fingerprint(secret)
    assert through_answer.json()["metadata"]["api_requests"] == len(through)


@pytest.mark.parametrize(("runtime", "api_name"), RUNTIMES)
def test_no_key_is_in_the_environment_of_any_process_of_the_turn(
    servers: dict[str, ServerProcess],
    api_of: dict[str, Api],
    secret_registry: SecretRegistry,
    runtime: str,
    api_name: str,
) -> None:
    """While the API holds the CLI's request, no process of the turn holds the override or
    the baseline key (/proc/<pid>/environ); the CLI holds a placeholder."""
    api = api_of[api_name]
    server = servers[f"{runtime}-brokered"]
    secret = secret_registry.new(f"broker_environ_{api_name}")
    response, sent = turn(api, server, {"message": "hi", "auth_override": {"api_key": secret}})
    assert response.status_code == 200, response.text
    environs = [environ for captured in sent for environ in captured.environs]
    assert environs, "no process of the turn was alive while its request waited"
    baseline = server.environ["OPENAI_API_KEY" if api_name == "openai" else "GEMINI_API_KEY"]
    for environ in environs:
        assert secret.encode() not in environ
        assert baseline.encode() not in environ
    assert any(b"agent-server-placeholder-" in environ for environ in environs)


@pytest.mark.parametrize(("runtime", "api_name"), RUNTIMES)
def test_a_429_of_the_api_is_a_rate_limit_read_from_the_exchange(
    servers: dict[str, ServerProcess],
    api_of: dict[str, Api],
    secret_registry: SecretRegistry,
    runtime: str,
    api_name: str,
) -> None:
    """The stand-in's 429 is the answer's rate limit, blamed on the override that got it."""
    api = api_of[api_name]
    secret = secret_registry.new(f"broker_ratelimit_{api_name}")
    response, sent = turn(
        api, servers[f"{runtime}-brokered"], {"message": "hi", "auth_override": {"api_key": secret}}
    )
    assert response.status_code == 429, response.text
    detail = response.json()["detail"]
    assert (detail["error_code"], detail["switch_credential"]) == ("rate_limit", True)
    assert detail["metadata"]["fingerprint"] == "sha256:" + fingerprint(secret)
    assert response.headers[OVERRIDE_HEADER] == "api_key"
    assert sent and all(
        c.headers[k] == "fp:" + fingerprint(secret)
        for c in sent
        for k in _KEY_HEADERS
        if k in c.headers
    )


@pytest.mark.parametrize(("runtime", "api_name"), RUNTIMES)
def test_each_turn_uses_its_own_api_key_override(
    servers: dict[str, ServerProcess],
    api_of: dict[str, Api],
    secret_registry: SecretRegistry,
    runtime: str,
    api_name: str,
) -> None:
    """Two turns with two overrides, and one without: each reaches the API with its own
    key (the baseline's for the third), named by the answer."""
    api = api_of[api_name]
    server = servers[f"{runtime}-brokered"]
    baseline = server.environ["OPENAI_API_KEY" if api_name == "openai" else "GEMINI_API_KEY"]
    for override in (
        secret_registry.new(f"turn_a_{api_name}"),
        secret_registry.new(f"turn_b_{api_name}"),
        None,
    ):
        body: dict[str, Any] = {"message": "hi"}
        if override is not None:
            body["auth_override"] = {"api_key": override}
        response, _ = turn(api, server, body)
        assert response.status_code == 200, response.text
        expected = override or baseline
        assert response.json()["response"].strip() == f"served-by fp={fingerprint(expected)}"
        assert response.headers.get(OVERRIDE_HEADER) == ("api_key" if override else None)


@pytest.mark.parametrize(("runtime", "api_name"), RUNTIMES)
def test_a_ladder_turn_completes_on_b_after_as_429(
    servers: dict[str, ServerProcess],
    api_of: dict[str, Api],
    secret_registry: SecretRegistry,
    runtime: str,
    api_name: str,
) -> None:
    """A's 429 never reaches the CLI: the same request goes again on B, which serves;
    the answer names both keys, A's refusal a rate limit."""
    api = api_of[api_name]
    a = secret_registry.new(f"ladder_ratelimit_{api_name}")
    b = secret_registry.new(f"ladder_b_{api_name}")
    body = {"message": "hi", "auth_override": {"api_key": a}, "auth_ladder": [{"api_key": b}]}
    response, sent = turn(api, servers[f"{runtime}-brokered"], body)
    assert response.status_code == 200, response.text
    assert response.json()["response"].strip() == f"served-by fp={fingerprint(b)}"
    key_header = "authorization" if api_name == "openai" else "x-goog-api-key"
    assert [c.headers[key_header] for c in sent] == [f"fp:{fingerprint(a)}", f"fp:{fingerprint(b)}"]
    assert comparable(sent[0])["body"] == comparable(sent[1])["body"]
    used_a, used_b = response.json()["metadata"]["credentials"]
    assert [r["error_code"] for r in used_a["refusals"]] == ["rate_limit"]
    assert (used_b["fingerprint"], used_b["served"]) == ("sha256:" + fingerprint(b), 1)


@pytest.mark.parametrize(("runtime", "api_name"), RUNTIMES)
def test_a_dotenv_route_to_the_agents_host_moves_no_key(
    servers: dict[str, ServerProcess],
    api_of: dict[str, Api],
    secret_registry: SecretRegistry,
    runtime: str,
    api_name: str,
    tmp_path: Path,
) -> None:
    """`.env`'s base URL (and, for Codex, a `CODEX_HOME` whose config.toml names a provider
    of the agent's host) is not the route of the server's key: the API serves the turn
    with the override, the agent's host hears nothing."""
    api = api_of[api_name]
    server = servers[f"{runtime}-brokered"]
    host: Api = CapturingResponses() if api_name == "openai" else CapturingGemini()
    with host:
        if isinstance(host, CapturingResponses):
            home = host.write_codex_home(tmp_path / "agent-codex-home")
            lines = f"OPENAI_BASE_URL={host.base_url}/v1\nCODEX_HOME={home}\n"
        else:
            lines = f"GOOGLE_GEMINI_BASE_URL={host.base_url}\n"
        server.env_file.write_text(lines)
        try:
            secret = secret_registry.new(f"dotenv_route_{api_name}")
            body = {"message": "hi", "auth_override": {"api_key": secret}}
            response, _ = turn(api, server, body)
        finally:
            server.env_file.unlink()
        assert host.captured == []
    assert response.status_code == 200, response.text
    assert response.json()["response"].strip() == f"served-by fp={fingerprint(secret)}"

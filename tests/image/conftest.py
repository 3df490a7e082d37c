"""The image tier: the built agent image (`make image`) run by a real docker daemon.

`make test` builds the image first when a daemon answers; `.ci/run` always starts one.
Without a daemon (or without the image) these tests skip, but FAIL under `CI`.

Every container runs with `--network host`, listens on 127.0.0.1 on a port chosen free
at run time, and carries the label `agent-server.test-run=<run id>` (as do its
volumes): each test removes what it made, and the session removes whatever is left
with its run id. Container logs and response bodies are written beside each other
under the test's tmp dir (`*.log`, `*.log.bodies`) for the session's leak sweep.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import certifi
import httpx
import pytest

from tests.conftest import SecretRegistry, unavailable
from tests.support.server import free_port, read_bodies

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("AGENT_SERVER_TEST_IMAGE", "agent-server:dev")
RUN_ID = uuid.uuid4().hex[:10]
_NUMBERS = itertools.count()
RUN_LABEL = f"agent-server.test-run={RUN_ID}"
STATE_DIR = "/var/lib/trinity"
TOKEN_HEADER = "X-Trinity-Agent-Token"
# Where a container sees the repository's tests/ (the fake CLIs), read-only.
TESTS_MOUNT = "/opt/agent-server-tests/tests"
FAKE_CLAUDE = f"{TESTS_MOUNT}/support/fake-claude"
INTRUDER = f"{TESTS_MOUNT}/support/intruder-cli"


class Docker:
    """The docker CLI, every call bounded in time."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def run(
        self, *args: str, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`docker ARGS`; raises with docker's stderr when it fails and `check`."""
        result = subprocess.run(
            [self.binary, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if check and result.returncode != 0:
            msg = f"docker {' '.join(args[:3])} … exited {result.returncode}: {result.stderr}"
            raise AssertionError(msg)
        return result

    def inspect(self, *names: str) -> list[dict[str, Any]]:
        """`docker inspect` as parsed JSON."""
        found: list[dict[str, Any]] = json.loads(self.run("inspect", *names).stdout)
        return found

    def remove_run(self, label: str) -> None:
        """Remove every container and volume carrying `label` (best effort)."""
        listed = self.run("ps", "-aq", "--filter", f"label={label}", check=False)
        ids = listed.stdout.split()
        if ids:
            self.run("rm", "-f", "-v", *ids, check=False, timeout=120)
        listed = self.run("volume", "ls", "-q", "--filter", f"label={label}", check=False)
        volumes = listed.stdout.split()
        if volumes:
            self.run("volume", "rm", "-f", *volumes, check=False)


@pytest.fixture(scope="session")
def docker() -> Iterator[Docker]:
    """The docker CLI with a daemon that answers; the run's leftovers removed at the end."""
    binary = shutil.which("docker")
    if binary is None:
        unavailable("no docker client on PATH")
    cli = Docker(binary)
    try:
        answered = cli.run("info", "--format", "{{.ServerVersion}}", timeout=30, check=False)
    except subprocess.TimeoutExpired:
        answered = None
    if answered is None or answered.returncode != 0:
        unavailable("no docker daemon answers")
    try:
        yield cli
    finally:
        cli.remove_run(RUN_LABEL)


@pytest.fixture(scope="session")
def image(docker: Docker) -> dict[str, Any]:
    """The image under test, inspected: AGENT_SERVER_TEST_IMAGE (default agent-server:dev)."""
    found = docker.run("image", "inspect", IMAGE, check=False)
    if found.returncode != 0:
        unavailable(f"the image {IMAGE} is not built: run `make image`")
    inspected: dict[str, Any] = json.loads(found.stdout)[0]
    return inspected


_PROCESSES = """
import glob, json
found = []
for path in glob.glob('/proc/[0-9]*/status'):
    try:
        with open(path) as status:
            fields = (line.rstrip('\\n').split(':\\t', 1) for line in status if ':\\t' in line)
            found.append(dict(fields))
    except OSError:
        pass  # gone meanwhile
print(json.dumps(found))
"""


class Container:
    """One `docker run -d` of the image: the agent-server on 127.0.0.1:<port>."""

    def __init__(
        self,
        docker: Docker,
        name: str,
        *,
        env: dict[str, str],
        volume: str,
        log_path: Path,
        run_args: Sequence[str] = (),
        mount: str = STATE_DIR,
    ) -> None:
        self.docker = docker
        self.name = name
        self.port = free_port()
        self.volume = volume
        self.mount = mount
        self.log_path = log_path
        self.bodies_path = log_path.with_name(log_path.name + ".bodies")
        self.token = env.get("TRINITY_AGENT_AUTH_TOKEN")
        self.env = {
            "AGENT_NAME": "image-test",
            **env,
            "AGENT_SERVER_HOST": "127.0.0.1",
            "AGENT_SERVER_PORT": str(self.port),
        }
        self.run_args = list(run_args)

    @property
    def base_url(self) -> str:
        """The server's URL on loopback (the container shares the host's network)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, timeout: float = 60) -> Container:
        """`docker run -d` and wait until /health answers."""
        env_args = [arg for key, value in self.env.items() for arg in ("-e", f"{key}={value}")]
        self.docker.run(
            "run",
            "-d",
            "--name",
            self.name,
            "--label",
            RUN_LABEL,
            "--network",
            "host",
            "--mount",
            f"type=volume,src={self.volume},dst={self.mount}",
            *env_args,
            *self.run_args,
            IMAGE,
            timeout=120,
        )
        self.wait_serving(timeout)
        return self

    def wait_serving(self, timeout: float = 60) -> None:
        """Wait until /health answers 200 (failing early when the container exits)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if not self.state().get("Running"):
                msg = f"{self.name} is not running: {self.state()}\n{self.logs()}"
                raise AssertionError(msg)
            time.sleep(0.1)
        msg = f"{self.name} never served /health within {timeout}s:\n{self.logs()}"
        raise AssertionError(msg)

    def state(self) -> dict[str, Any]:
        """`.State` of `docker inspect`."""
        state: dict[str, Any] = self.docker.inspect(self.name)[0]["State"]
        return state

    def request(
        self, method: str, path: str, *, token: str | None = None, timeout: float = 30, **kw: Any
    ) -> httpx.Response:
        """One request with the controller token (`token=""` sends none); the body is kept."""
        sent = self.token if token is None else token
        headers = {TOKEN_HEADER: sent} if sent else {}
        response = httpx.request(
            method, f"{self.base_url}{path}", headers=headers, timeout=timeout, **kw
        )
        with self.bodies_path.open("a") as out:
            out.write(json.dumps(response.text) + "\n")
        return response

    def exec(self, *command: str, user: str | None = None) -> str:
        """`docker exec` as `user` (by default the image's, root); its stdout."""
        as_user = ("--user", user) if user else ()
        return self.docker.run("exec", *as_user, self.name, *command).stdout

    def processes(self) -> list[dict[str, str]]:
        """The `/proc/<pid>/status` fields of every process in the container. What `docker
        exec` runs, this reader too, has PPid 0: its parent is outside the container."""
        listed: list[dict[str, str]] = json.loads(self.exec("python", "-I", "-c", _PROCESSES))
        return listed

    def server_status(self) -> dict[str, str]:
        """The `/proc/<pid>/status` fields of the one agent-server process."""
        (server,) = [p for p in self.processes() if p["Name"] == "agent-server"]
        return server

    def wait_running(self, execution_id: str) -> None:
        """Wait until the server lists `execution_id` among its running turns."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listing = self.request("GET", "/api/executions/running").json()
            if execution_id in {e["execution_id"] for e in listing["executions"]}:
                return
            time.sleep(0.05)
        msg = f"{execution_id} never ran:\n{self.logs()}"
        raise AssertionError(msg)

    def logs(self) -> str:
        """Everything the container wrote to stdout and stderr so far."""
        result = self.docker.run("logs", self.name, check=False)
        return result.stdout + result.stderr

    def save_logs(self) -> str:
        """Write the logs beside the bodies (for the session's leak sweep); return them."""
        text = self.logs()
        self.log_path.write_text(text)
        return text

    def remove(self) -> None:
        """Remove the container and its volume."""
        self.docker.run("rm", "-f", self.name, check=False)
        self.docker.run("volume", "rm", "-f", self.volume, check=False)


class Containers:
    """Makes containers with unique names; removes them and leak-checks their logs at close."""

    def __init__(self, docker: Docker, root: Path, registry: SecretRegistry) -> None:
        self.docker = docker
        self.root = root
        self.registry = registry
        self.made: list[Container] = []

    def environ(self, **extra: str) -> dict[str, str]:
        """A controller token and a baseline OAuth token, both registered secrets."""
        return {
            "TRINITY_AGENT_AUTH_TOKEN": self.registry.new("image_controller"),
            "CLAUDE_CODE_OAUTH_TOKEN": self.registry.new("image_baseline"),
            **extra,
        }

    def create(
        self, env: dict[str, str], *, run_args: Sequence[str] = (), mount: str = STATE_DIR
    ) -> Container:
        """A container (not started yet) with its own new volume, mounted at `mount`."""
        name = f"agent-server-test-{RUN_ID}-{next(_NUMBERS)}"
        self.docker.run("volume", "create", "--label", RUN_LABEL, f"{name}-state")
        container = Container(
            self.docker,
            name,
            env=env,
            volume=f"{name}-state",
            log_path=self.root / f"{name}.log",
            run_args=run_args,
            mount=mount,
        )
        self.made.append(container)
        return container

    def close(self) -> None:
        """Save every container's logs, remove it, and fail when a test secret is in them."""
        texts: list[str] = []
        try:
            for container in self.made:
                texts.append(container.save_logs())
                texts += read_bodies(container.bodies_path)
        finally:
            for container in self.made:
                container.remove()
        leaked = self.registry.leaks(texts)
        assert not leaked, f"test secrets in container logs or responses: {leaked}"


@pytest.fixture
def containers(
    docker: Docker, image: dict[str, Any], tmp_path: Path, secret_registry: SecretRegistry
) -> Iterator[Containers]:
    """Containers of one test, removed (and leak-checked) at its end."""
    factory = Containers(docker, tmp_path, secret_registry)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="module")
def module_containers(
    docker: Docker,
    image: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
    secret_registry: SecretRegistry,
) -> Iterator[Containers]:
    """Containers shared by one test module, removed (and leak-checked) at its end."""
    factory = Containers(docker, tmp_path_factory.mktemp("containers"), secret_registry)
    try:
        yield factory
    finally:
        factory.close()


# --- the image's size, in the session's summary ---------------------------------------

_SIZE = pytest.StashKey[str]()


def report_size(config: pytest.Config, line: str) -> None:
    """Remember a line for the terminal summary."""
    config.stash[_SIZE] = line


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """Print the image size the image tier measured."""
    line = config.stash.get(_SIZE, None)
    if line:
        terminalreporter.write_line(line)


# --- what must never be in the image: the build's CA bundle -----------------------------

CA_BUNDLE_VARIABLES = ("SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "PIP_CERT")
HOST_CERTIFICATES = Path("/usr/share/ca-certificates")
PEM_BLOCK = re.compile(
    r"-----BEGIN CERTIFICATE-----\s*\n(.*?)\n\s*-----END CERTIFICATE-----", re.DOTALL
)


def build_ca_bundle() -> Path | None:
    """The CA bundle `make image` hands the build as a secret (docker/build-image.sh's rule)."""
    for variable in CA_BUNDLE_VARIABLES:
        value = os.environ.get(variable)
        if value and Path(value).is_file() and Path(value).stat().st_size > 0:
            return Path(value)
    return None


def certificate_bodies(text: str) -> list[list[str]]:
    """The base64 lines of every PEM certificate in `text`."""
    bodies = []
    for block in PEM_BLOCK.findall(text):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if lines:
            bodies.append(lines)
    return bodies


def tar_files(stream: IO[bytes]) -> Iterator[tuple[str, IO[bytes]]]:
    """(path, content) of every regular file of a tar stream, in order."""
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            if member.isfile():
                content = archive.extractfile(member)
                if content is not None:
                    yield member.name, content


def find_needles(
    stream: IO[bytes], needles: dict[str, bytes], chunk: int = 8 << 20
) -> dict[str, list[str]]:
    """Which files of a tar stream hold which needles (by label)."""
    hits: dict[str, list[str]] = {}
    overlap = max((len(n) for n in needles.values()), default=1) - 1
    for path, content in tar_files(stream):
        tail = b""
        found: set[str] = set()
        while block := content.read(chunk):
            window = tail + block
            found.update(label for label, needle in needles.items() if needle in window)
            tail = window[-overlap:] if overlap else b""
        if found:
            hits[path] = sorted(found)
    return hits


@pytest.fixture(scope="session")
def ca_needles(docker: Docker, image: dict[str, Any]) -> dict[str, bytes]:
    """Lines of the build's CA bundle that are in no public certificate store.

    Each certificate of the bundle that is in none of the public stores (the image's
    and this machine's Debian certificates under /usr/share/ca-certificates, certifi's
    bundle) gives two of its base64 lines: a private CA, such as a TLS-intercepting
    proxy's, which must never reach a layer. Public ones are in the image anyway.
    """
    bundle = build_ca_bundle()
    if bundle is None:
        pytest.skip(f"none of {', '.join(CA_BUNDLE_VARIABLES)} names a CA bundle: no secret")
    name = f"agent-server-test-{RUN_ID}-certs"
    docker.run("create", "--label", RUN_LABEL, "--name", name, IMAGE, timeout=120)
    try:
        copied = subprocess.run(
            [docker.binary, "cp", f"{name}:/usr/share/ca-certificates", "-"],
            capture_output=True,
            timeout=60,
            check=True,
        )
    finally:
        docker.run("rm", "-f", name, check=False)
    stores = [
        content.read().decode(errors="replace")
        for _, content in tar_files(io.BytesIO(copied.stdout))
    ]
    stores += [p.read_text(errors="replace") for p in HOST_CERTIFICATES.rglob("*.crt")]
    stores.append(Path(certifi.where()).read_text())
    public = {line for store in stores for body in certificate_bodies(store) for line in body}
    needles: dict[str, bytes] = {}
    for number, body in enumerate(certificate_bodies(bundle.read_text(errors="replace"))):
        # Lines of the key and of the signature: random, so no other certificate has them.
        middle, signature = len(body) // 2, max(len(body) - 2, 0)
        if len(body) > 4 and body[middle] not in public:
            needles[f"CA certificate #{number}, line {middle + 1}"] = body[middle].encode()
            needles[f"CA certificate #{number}, line {signature + 1}"] = body[signature].encode()
    if not needles:
        pytest.skip(f"{bundle} holds only certificates the image ships: nothing private")
    return needles

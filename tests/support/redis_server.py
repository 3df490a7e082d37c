"""A real `redis-server` (Debian's package) on a free loopback port, for the Redis store;
and `store_url`, an empty store of each kind, for the tests every store must pass.

It keeps nothing on disk (`--save ''`, no append-only file) and lives in a temp dir.
Without the binary the tests skip locally and FAIL under `CI` (`.ci/run` installs
`redis-server`), like the image tier without a docker daemon.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import unavailable
from tests.support.server import free_port

START_TIMEOUT_S = 10.0


def require_redis_server() -> str:
    """The redis-server binary: fail under CI when it is missing, else skip."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server is not installed (apt-get install redis-server)")
    return binary


class RedisServer:
    """One redis-server process; `url(db)` names one of its databases."""

    def __init__(self, binary: str, root: Path) -> None:
        self.port = free_port()
        self.root = root
        self.process = subprocess.Popen(
            [
                binary,
                "--bind", "127.0.0.1",
                "--port", str(self.port),
                "--dir", str(root),
                "--save", "",
                "--appendonly", "no",
                "--protected-mode", "yes",
                "--logfile", str(root / "redis.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self._wait_ready()

    def url(self, db: int = 0) -> str:
        """`redis://127.0.0.1:PORT/DB`."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def flush(self, db: int = 0) -> None:
        """Empty one database."""
        with redis.Redis.from_url(self.url(db)) as client:
            client.flushdb()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with redis.Redis.from_url(self.url(), socket_timeout=1) as client:
                    if client.ping():
                        return
            except redis.RedisError:
                time.sleep(0.05)
        self.stop()
        log = self.root / "redis.log"
        msg = f"redis-server did not answer: {log.read_text() if log.exists() else ''}"
        raise RuntimeError(msg)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server for the session, stopped at its end."""
    server = RedisServer(require_redis_server(), tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


STORE_DB = 3
"""The Redis database the store tests use (emptied before each)."""


@pytest.fixture(params=["sqlite", "redis"], name="store_url")
def store_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty pool store of each kind: SQLite in tmp_path, Redis on the server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/pool.sqlite3"
    server: RedisServer = request.getfixturevalue("redis_server")
    server.flush(STORE_DB)
    return server.url(STORE_DB)

"""`docker stop` with a turn in flight: the turn answers 504 killed, the container exits 143.

The turn is the repository's fake Claude Code (`@sleep 30`), mounted read-only into
the container; the image's Python runs it. The shutdown grace is 2 s, so the server
kills the turn's process group long before docker's stop timeout would SIGKILL it.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from agent_server.process.timings import STOP_TIMEOUT_MARGIN_S
from tests.image.conftest import FAKE_CLAUDE, REPO, TESTS_MOUNT, Containers, Docker

GRACE_S = 2
STOP_TIMEOUT_S = 20


@pytest.mark.timeout(180)
def test_docker_stop_mid_turn_answers_504_killed_and_exits_143(
    containers: Containers, docker: Docker
) -> None:
    """SIGTERM via `docker stop`: grace, kill, 504 `killed`, exit 143 before the timeout."""
    env = containers.environ(
        AGENT_SERVER_RUNTIME_COMMAND=FAKE_CLAUDE, AGENT_SERVER_SHUTDOWN_GRACE_S=str(GRACE_S)
    )
    agent = containers.create(
        env, run_args=["--init", "-v", f"{REPO / 'tests'}:{TESTS_MOUNT}:ro"]
    ).start()
    execution_id = f"image-stop-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(
            agent.request,
            "POST",
            "/api/task",
            json={"message": "@sleep 30", "execution_id": execution_id},
            timeout=90,
        )
        agent.wait_running(execution_id)
        sent = time.monotonic()
        docker.run("stop", "-t", str(STOP_TIMEOUT_S), agent.name, timeout=STOP_TIMEOUT_S + 30)
        stopped_after = time.monotonic() - sent
        response: httpx.Response = turn.result(timeout=60)
    assert response.status_code == 504, response.text
    assert response.json()["detail"]["error_code"] == "killed", response.text
    state = agent.state()
    assert state["ExitCode"] == 143, state
    assert not state["OOMKilled"], state
    assert stopped_after < GRACE_S + STOP_TIMEOUT_MARGIN_S < STOP_TIMEOUT_S, stopped_after

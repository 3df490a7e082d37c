"""The fleet page (`GET /` of `agent-server pool serve`) in a real headless Chromium.

A real `pool serve` over a SQLite store seeded with both subscriptions' readings and a
waiting turn, in front of a real agent-server (the fake CLI). Chromium opens the page
over DevTools (tests/support/cdp.py), the token is typed into its form as an operator
would, and the page must show every credential's windows and the waiting turn; then,
with no reload, a heartbeat with hostile text shows as text, and a stop through the API
removes the waiting turn and shows up in the recent events.
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_server.controller.clock import utc_now
from agent_server.controller.pool.state import (
    CredentialInfo,
    Reading,
    ScheduledRetry,
    WindowUse,
)
from agent_server.controller.stores.base import open_store
from tests.conftest import SecretRegistry, unavailable
from tests.e2e.conftest import TurnServers
from tests.support.cdp import Chromium, Page, chromium_binary
from tests.support.pool_service import PoolServiceProcess, write_pool_file
from tests.support.server import CONTROLLER_TOKEN, free_port

pytestmark = pytest.mark.timeout(120)
AGENT = "agent-1"
WINDOWS = {"sub-a": (0.42, 0.9), "sub-b": (0.07, 0.31)}
HOSTILE = '<img src=x onerror="document.title=1">'

CARDS = """[...document.querySelectorAll('[data-credential]')].map((card) => ({
  id: card.dataset.credential,
  windows: Object.fromEntries([...card.querySelectorAll('[data-window]')].map(
    (w) => [w.dataset.window, [Number(w.dataset.use), w.querySelector('.resets').textContent]])),
}))"""
WAITING = (
    "[...document.querySelectorAll('#waiting tr[data-turn]')]"
    ".map((r) => [r.dataset.turn, r.querySelector('.due').textContent])"
)
READS = "Number(document.getElementById('updated').dataset.reads)"
LIVENESS = (
    f"(r => r && [r.children[2].dataset.live, r.children[2].textContent])"
    f"""(document.querySelector('#agents tr[data-agent="{AGENT}"]'))"""
)
TOOL = f"""(document.querySelector('#agents tr[data-agent="{AGENT}"] .tool') || {{}}).textContent"""


async def _seed(store_url: str) -> None:
    """Both subscriptions measured, the agent on sub-a, one turn waiting an hour."""
    store = await open_store(store_url)
    now = utc_now()
    try:
        await store.register_credentials([CredentialInfo(i, "subscription") for i in WINDOWS])
        for ident, (five, seven) in WINDOWS.items():
            reading = Reading(
                ident,
                now,
                "allowed",
                five_hour=WindowUse(five, now + timedelta(hours=3), "allowed"),
                seven_day=WindowUse(seven, now + timedelta(days=4), "allowed"),
            )
            await store.record(reading=reading)
        made = await store.compare_and_set_assignment(
            AGENT, "sub-a", expected_generation=None, at=now
        )
        assert made is not None
        due = now + timedelta(hours=1)
        await store.schedule_retry(ScheduledRetry(AGENT, "r-1", due, 1, "job-7", now))
    finally:
        await store.close()


def _open(page: Page, url: str, token: str) -> None:
    """Open the page and give it the token through its own form."""
    page.navigate(url + "/")
    page.wait_for("!document.getElementById('login').hidden", bool)
    typed = json.dumps(token)
    page.evaluate(
        f"document.getElementById('token').value = {typed};"
        "document.getElementById('login').requestSubmit(); true"
    )


def _browser() -> str:
    binary = chromium_binary()
    if binary is None:
        unavailable("no chromium to open the page in (Debian: apt-get install chromium)")
    return binary


def test_the_page_shows_the_pool_and_follows_its_events(
    tmp_path: Path, turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """Every credential's windows with their resets and the waiting turn; then, without a
    reload, a heartbeat's tool (hostile text, shown as text) and a stop's effect."""
    binary = _browser()
    agent = turn_servers.start()
    store_url = f"sqlite:///{tmp_path}/pool.sqlite3"
    asyncio.run(_seed(store_url))
    secrets = [(i, "subscription", secret_registry.new(f"page_{i}")) for i in WINDOWS]
    pool_file = write_pool_file(
        tmp_path / "pool", secrets, agents={AGENT: (agent.base_url, CONTROLLER_TOKEN)}
    )
    with (
        PoolServiceProcess(pool_file, store_url, tmp_path / "service") as service,
        Chromium(tmp_path / "browser", binary) as browser,
    ):
        page = browser.page()
        _open(page, service.url, service.token)
        cards: list[dict[str, Any]] = page.wait_for(CARDS, lambda v: bool(v) and len(v) == 2)
        assert [c["id"] for c in cards] == list(WINDOWS)
        for card, (five, seven) in zip(cards, WINDOWS.values(), strict=True):
            shown = card["windows"]
            assert (shown["five_hour"][0], shown["seven_day"][0]) == (
                round(five * 100),
                round(seven * 100),
            )
            assert shown["five_hour"][1].startswith("resets in 3.0 h"), shown
            assert shown["seven_day"][1].startswith("resets in 4.0 d"), shown
        (waiting,) = page.wait_for(WAITING, bool)
        assert waiting[0] == "job-7" and waiting[1].startswith("in 60 min"), waiting
        assert service.token not in page.evaluate("location.href")
        page.evaluate("window.stillThisPage = true")
        # Connected, and the read that follows connecting done: any later read is an event's.
        page.wait_for("document.getElementById('link').textContent", lambda t: t == "live")
        page.wait_for(READS, lambda n: n == 2)

        running = {"execution_id": "e-1", "tool": HOSTILE, "summary": "make test", "since": "now"}
        beat = {"active_executions": 1, "executions": [running]}
        bearer = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
        sent = service.post(f"/api/agents/{AGENT}/heartbeat", json=beat, headers=bearer)
        assert sent.status_code == 204, sent.text
        assert page.wait_for(TOOL, lambda t: bool(t)) == f"{HOSTILE}: make test"
        assert page.evaluate("[document.querySelectorAll('img').length, document.title]") == [
            0,
            "agent pool",
        ]

        stopped = service.post(f"/v1/agents/{AGENT}/stop")
        assert stopped.status_code == 200, stopped.text
        assert page.wait_for(WAITING, lambda rows: rows == []) == []
        assert page.evaluate(READS) == 3
        events = page.wait_for("document.getElementById('events').textContent", bool)
        assert AGENT in events
        assert page.evaluate("window.stillThisPage") is True


def test_a_real_agents_heartbeat_shows_its_running_tool(
    tmp_path: Path, turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """An agent-server whose backend is the service: while its turn runs Bash, the page
    shows the agent alive with Bash and its command, from the agent's own heartbeats."""
    binary = _browser()
    agent_port = free_port()
    secrets = [("sub-a", "subscription", secret_registry.new("page_beat_sub_a"))]
    agent_url = f"http://127.0.0.1:{agent_port}"
    pool_file = write_pool_file(
        tmp_path / "pool", secrets, agents={AGENT: (agent_url, CONTROLLER_TOKEN)}
    )
    store_url = f"sqlite:///{tmp_path}/pool.sqlite3"
    with (
        PoolServiceProcess(pool_file, store_url, tmp_path / "service") as service,
        Chromium(tmp_path / "browser", binary) as browser,
    ):
        agent = turn_servers.start(
            AGENT_NAME=AGENT,
            AGENT_SERVER_PORT=str(agent_port),
            TRINITY_BACKEND_URL=service.url,
            TRINITY_MCP_API_KEY=CONTROLLER_TOKEN,
            AGENT_SERVER_HEARTBEAT_INTERVAL_S="0.5",
        )
        page = browser.page()
        _open(page, service.url, service.token)
        page.wait_for(LIVENESS, lambda v: v is not None and v[0] == "alive")
        answers: list[int] = []

        def run_turn() -> None:
            message = {"message": "@tool Bash make test-page\n@sleep 4"}
            answers.append(agent.request("POST", "/api/task", json=message).status_code)

        turn = threading.Thread(target=run_turn, name="page-turn")
        turn.start()
        try:
            # A beat before the CLI's tool line arrives shows the turn as "starting".
            shown = page.wait_for(TOOL, lambda t: t == "Bash: make test-page")
            assert shown == "Bash: make test-page"
        finally:
            turn.join(30)
        assert answers == [200]
        assert page.wait_for(TOOL, lambda t: t == "") == ""

"""`agent-server pool walk|status`: what an operator types, and what it refuses."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import pytest

from agent_server.__main__ import main
from agent_server.controller.clock import utc_now
from agent_server.controller.pool.state import Failure, Reading, ScheduledRetry, WindowUse
from agent_server.controller.stores.base import open_store

POOL = (
    '[[credential]]\nid = "a"\nkind = "subscription"\nsecret_env = "CLI_A"\n'
    '[[credential]]\nid = "b"\nkind = "subscription"\nsecret_file = "b.token"\n'
    '[[credential]]\nid = "key"\nkind = "api_key"\nsecret_env = "CLI_KEY"\n'
)


@pytest.fixture
def pool_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLI_A", "tsec-cli-a-0123456789")
    monkeypatch.setenv("CLI_KEY", "tsec-cli-key-0123456789")
    (tmp_path / "b.token").write_text("tsec-cli-b-0123456789\n")
    path = tmp_path / "pool.toml"
    path.write_text(POOL)
    return path


async def _seed(url: str) -> None:
    store = await open_store(url)
    now = utc_now()
    await store.compare_and_set_assignment("agent-1", "b", expected_generation=None, at=now)
    await store.record(failure=Failure("a", "rate_limit", now, now + timedelta(hours=1)))
    await store.record(
        reading=Reading(
            "b", now, "allowed", None, WindowUse(0.42, now + timedelta(hours=2), "allowed")
        )
    )
    due = now + timedelta(minutes=5)
    await store.schedule_retry(ScheduledRetry("agent-1", "r1", due, 1, "job-7", now))
    await store.set_gateway_until("agent-2", now + timedelta(minutes=15))
    until = now + timedelta(minutes=30)
    assert await store.acquire_lease("b", "turn-1", ceiling=2, at=now, until=until)
    await store.close()


def test_pool_status_prints_one_row_a_credential(
    pool_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The JSON list has the operator's fields; the table says the same."""
    url = f"sqlite:///{tmp_path}/pool.sqlite3"
    asyncio.run(_seed(url))
    assert main(["pool", "status", "--pool", str(pool_file), "--store", url, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert set(status) == {"at", "credentials", "assignments", "waiting", "cooldowns"}
    rows = {row["credential"]: row for row in status["credentials"]}
    assert list(rows) == ["a", "b", "key"]
    assert set(rows["a"]) == {
        "credential",
        "kind",
        "state",
        "resets_at",
        "five_hour_use",
        "seven_day_use",
        "last_failure",
        "assigned_agents",
        "failures",
        "reading",
        "in_flight",
    }
    assert set(rows["a"]["failures"]) == {"rate_limit"}
    assert rows["b"]["reading"]["five_hour"]["utilization"] == 0.42
    assert [(a["agent"], a["credential"]) for a in status["assignments"]] == [("agent-1", "b")]
    assert [(w["agent"], w["turn"]) for w in status["waiting"]] == [("agent-1", "job-7")]
    assert status["waiting"][0]["due_at"].endswith("Z")
    assert [c["agent"] for c in status["cooldowns"]] == ["agent-2"]
    assert (rows["a"]["state"], rows["a"]["last_failure"]["kind"]) == ("throttled", "rate_limit")
    assert rows["a"]["resets_at"].endswith("Z")
    assert (rows["b"]["state"], rows["b"]["five_hour_use"]) == ("available", 0.42)
    assert rows["b"]["assigned_agents"] == ["agent-1"]
    assert (rows["a"]["in_flight"], rows["b"]["in_flight"]) == (0, 1)
    assert main(["pool", "status", "--pool", str(pool_file), "--store", url]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == [
        "CREDENTIAL", "KIND", "STATE", "RESETS", "AT", "5H", "7D", "LAST", "FAILURE", "AGENTS",
    ]  # fmt: skip
    assert "42%" in table
    assert "tsec" not in table


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        pytest.param(
            lambda text: text.replace('secret_env = "CLI_A"', 'secret = "tsec-inline-0123456789"'),
            "inline secret is refused",
            id="an inline secret",
        ),
        pytest.param(lambda text: text + "[oops", "not TOML", id="a broken file"),
    ],
)
def test_a_pool_file_it_cannot_use_exits_2(
    pool_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: object,
    says: str,
) -> None:
    """Exit 2 with one line on stderr, and no secret in it."""
    pool_file.write_text(edit(POOL))  # type: ignore[operator]
    url = f"sqlite:///{tmp_path}/pool.sqlite3"
    assert main(["pool", "status", "--pool", str(pool_file), "--store", url]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert "tsec" not in err


def test_walk_refuses_an_unreadable_token_file_and_an_unknown_store(
    pool_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both are exit 2 before any request is sent."""
    common = ["pool", "walk", "--pool", str(pool_file), "--agent-url", "http://127.0.0.1:1"]
    common += ["--agent-name", "agent-1", "--message", "hi"]
    missing = ["--agent-token-file", str(tmp_path / "absent"), "--store", "sqlite:///x.db"]
    assert main([*common, *missing]) == 2
    (tmp_path / "token").write_text("controller-token-0123456789")
    unknown = ["--agent-token-file", str(tmp_path / "token"), "--store", "mysql://db"]
    assert main([*common, *unknown]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err
    assert "store URL" in err


@pytest.mark.parametrize(
    ("listen", "token", "says"),
    [
        pytest.param("127.0.0.1", "tsec-svc-0123456789", "--listen must be", id="no port"),
        pytest.param("127.0.0.1:99999", "tsec-svc-0123456789", "--listen must", id="bad port"),
        pytest.param("127.0.0.1:1", None, "service token file", id="no token file"),
        pytest.param("127.0.0.1:1", "tsec svc", "service token in", id="a token with a space"),
    ],
)
def test_serve_refuses_what_it_cannot_use(
    pool_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    listen: str,
    token: str | None,
    says: str,
) -> None:
    """Exit 2 with one line naming the flag or file, never the token; nothing served."""
    token_file = tmp_path / "svc-token"
    if token is not None:
        token_file.write_text(token)
    argv = ["pool", "serve", "--pool", str(pool_file), "--listen", listen]
    argv += ["--token-file", str(token_file), "--store", f"sqlite:///{tmp_path}/s.db"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err
    assert "tsec" not in err


def test_walk_exits_1_when_the_server_cannot_be_reached(
    pool_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No server on the URL: exit 1 and a TransportError named, no traceback."""
    (tmp_path / "token").write_text("controller-token-0123456789")
    argv = ["pool", "walk", "--pool", str(pool_file), "--agent-url", "http://127.0.0.1:1"]
    argv += ["--agent-token-file", str(tmp_path / "token"), "--agent-name", "agent-1"]
    argv += ["--message", "hi", "--store", f"sqlite:///{tmp_path}/pool.sqlite3"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "TransportError" in err
    assert "Traceback" not in err


def test_stop_and_clear_from_the_shell(
    pool_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stop` cancels the agent's waiting turns; `clear` forgets a credential's failures;
    both print what they did, and stderr has no library chatter."""
    url = f"sqlite:///{tmp_path}/pool.sqlite3"
    asyncio.run(_seed(url))
    common = ["--pool", str(pool_file), "--store", url, "--json"]
    assert main(["pool", "stop", *common, "--agent-name", "agent-1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"agent": "agent-1", "cancelled_turns": 1}
    assert main(["pool", "clear", *common, "--credential", "a"]) == 0
    capsys.readouterr()
    assert main(["pool", "status", *common]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["waiting"] == []
    assert {row["credential"]: row["state"] for row in status["credentials"]}["a"] == "available"
    assert main(["pool", "clear", *common, "--credential", "nope"]) == 2


def test_assign_reloads_the_named_agents_server_and_events_go_out_as_json(
    pool_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`assign` needs the agent's server: unreachable, it exits 1 with one line, no
    traceback and no httpx INFO line; `--events-json` would print JSON lines."""
    (tmp_path / "token").write_text("controller-token-0123456789")
    url = f"sqlite:///{tmp_path}/pool.sqlite3"
    argv = ["pool", "assign", "--pool", str(pool_file), "--store", url, "--events-json"]
    argv += ["--agent-name", "agent-1", "--credential", "b"]
    argv += ["--agent-url", "http://127.0.0.1:1", "--agent-token-file", str(tmp_path / "token")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "TransportError" in err
    assert "HTTP Request" not in err
    assert "Traceback" not in err


def test_the_servers_help_names_pool(capsys: pytest.CaptureFixture[str]) -> None:
    """`agent-server --help` lists `pool` beside serve and status."""
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "pool" in capsys.readouterr().out

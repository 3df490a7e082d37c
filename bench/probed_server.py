"""`python -m bench.probed_server`: `agent-server serve` with timeline probes (bench only).

The server's code has no probe of its own: this harness wraps, from outside and in
this process only, the few functions a turn passes through, and records
`time.monotonic_ns()` (CLOCK_MONOTONIC, the same clock in every process of the
machine) as a turn reaches each step. Three routes of this harness only (no auth):

- `GET /__bench/probes` answers the marks recorded since the last call, and
  forgets them;
- `POST /__bench/direct` makes figure 1's direct spawn (plain asyncio, no turn code)
  from inside the server process, and answers its marks and the CLI's stdout: what
  the server's process costs a spawn, apart from what its code does;
- `POST /__bench/echo?bytes=N` reads the body and answers N bytes of JSON: an HTTP
  exchange through uvicorn and no code of the server's.

    received     the first bytes of a request reach the HTTP protocol
    app          uvicorn calls the ASGI app (headers parsed, task scheduled)
    parsed       the body is read and validated (`parse_json` returned)
    env          the spawn env is built (`SpawnEnvBuilder.build` returned)
    fork         `subprocess.Popen` is called (argv built, exec size checked)
    exec         `subprocess.Popen` returned: the CLI is exec'd
    spawned      the pipes are connected (`connection_made`)
    first_byte   the first stdout bytes arrive
    stdout_eof   stdout closed
    exited       the CLI's exit is observed (`process_exited`)
    ended        `run_process` returned: group reaped, escapees swept, pipes closed
    answering    the route starts its answer (outcome classified, body built)
    serialised   the answer is redacted and serialised (`respond.answer` returned)
    head         the answer's first bytes are handed to the socket (`transport.write`)
    written      the answer's last bytes are handed to the socket (`transport.write`)

A probe costs about a microsecond (a list append and a clock read).
"""

from __future__ import annotations

import asyncio.unix_events
import contextlib
import functools
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

PROBES_PATH = "/__bench/probes"
DIRECT_PATH = "/__bench/direct"
ECHO_PATH = "/__bench/echo"
_marks: list[tuple[str, int]] = []


def mark(name: str) -> None:
    """Record that the current turn reached `name` now."""
    _marks.append((name, time.monotonic_ns()))


def _around(before: str, after: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(before)
        result = function(*args, **kwargs)
        mark(after)
        return result

    return wrapper


def _after_async(
    name: str, function: Callable[..., Awaitable[Any]]
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(function)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = await function(*args, **kwargs)
        mark(name)
        return result

    return wrapper


class _ProbesApp:
    """The outermost ASGI app: the bench's two routes, and the `app` mark for the rest."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == PROBES_PATH:
            _marks.pop()  # this request's own `received`
            await _answer(send, take_marks())
            return
        if scope["type"] == "http" and scope["path"] == ECHO_PATH:
            _marks.pop()
            await _echo(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == DIRECT_PATH:
            _marks.pop()
            spec = json.loads((await receive())["body"])
            marks, stdout = await self._direct(spec)
            await _answer(send, {"marks": marks, "stdout": stdout.decode()})
            return
        if scope["type"] == "http":
            mark("app")
        await self.app(scope, receive, send)

    async def _direct(self, spec: dict[str, Any]) -> tuple[dict[str, int], bytes]:
        # The server's reaper must leave this child to asyncio, as it does a turn's CLI:
        # held off during the spawn, then told the child is a leader until it is reaped.
        reaper = self.app.state.reaper
        pids: list[int] = []

        def lead(pid: int) -> None:
            reaper.leaders.add(pid)
            pids.append(pid)

        try:
            return await direct_spawn(
                spec["argv"],
                spec["env"],
                spec["cwd"],
                spec["stdin"],
                spawning=reaper.spawning(),
                on_pid=lead,
            )
        finally:
            reaper.leaders.difference_update(pids)


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    """Read the whole body, answer `?bytes=N` bytes of JSON: an HTTP exchange, no work."""
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    size = int(scope["query_string"].partition(b"=")[2] or 2)
    await _answer(send, "x" * max(size - 2, 0))


async def _answer(send: Any, value: object) -> None:
    body = json.dumps(value).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def take_marks() -> list[tuple[str, int]]:
    """The marks recorded so far in this process, forgotten here."""
    taken = list(_marks)
    _marks.clear()
    return taken


def install() -> None:
    """Wrap the hot path's functions with probes (this process only)."""
    from agent_server import app as app_module
    from agent_server.client_limits import GuardedProtocol
    from agent_server.execution import turn
    from agent_server.process import pipes
    from agent_server.routes import executions
    from agent_server.spawn_env.builder import SpawnEnvBuilder

    create_app = app_module.create_app
    app_module.create_app = lambda *a, **k: _ProbesApp(create_app(*a, **k))  # type: ignore[assignment]

    data_received = GuardedProtocol.data_received

    def probed_data_received(self: GuardedProtocol, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:
            mark("received")
        data_received(self, data)

    GuardedProtocol.data_received = probed_data_received  # type: ignore[method-assign]
    connection_made = GuardedProtocol.connection_made

    def probed_connection_made(self: GuardedProtocol, transport: Any) -> None:
        write = transport.write

        def probed_write(data: bytes) -> None:
            if data:
                if _marks and _marks[-1][0] == "serialised":
                    mark("head")  # the first write of the answer
                mark("written")  # the last one of a response hands over its last bytes
            write(data)

        transport.write = probed_write
        connection_made(self, transport)

    GuardedProtocol.connection_made = probed_connection_made  # type: ignore[method-assign]

    executions.parse_json = _after_async("parsed", executions.parse_json)  # type: ignore[assignment]
    SpawnEnvBuilder.build = _after_async("env", SpawnEnvBuilder.build)  # type: ignore[method-assign]
    turn.run_process = _after_async("ended", turn.run_process)  # type: ignore[assignment]
    executions.answer = _around("answering", "serialised", executions.answer)  # type: ignore[assignment]
    probe_spawn()
    probe_protocol(pipes.ProcessProtocol)


def probe_spawn() -> Callable[[], None]:
    """Mark `fork` and `exec` around asyncio's Popen call; returns the undo."""
    transport = asyncio.unix_events._UnixSubprocessTransport  # type: ignore[attr-defined]
    start = transport._start

    def probed_start(self: Any, *args: Any, **kwargs: Any) -> None:
        mark("fork")
        start(self, *args, **kwargs)
        mark("exec")

    transport._start = probed_start

    def undo() -> None:
        transport._start = start

    return undo


async def direct_spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    stdin: str,
    spawning: contextlib.AbstractContextManager[Any] | None = None,
    on_pid: Callable[[int], None] | None = None,
) -> tuple[dict[str, int], bytes]:
    """Figure 1's direct turn (`create_subprocess_exec` + `communicate`, spelled out), marked.

    Returns the marks (`start`, `fork`, `exec` when `probe_spawn` is on, the
    protocol's, `done`) and the CLI's stdout. `spawning` is entered around the spawn
    itself, and `on_pid` gets the child's pid before the spawning is left.
    """
    loop = asyncio.get_running_loop()
    mark("start")
    with spawning or contextlib.nullcontext():
        transport, protocol = await loop.subprocess_exec(
            lambda: ProbedStreamProtocol(limit=2**16, loop=loop),
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        if on_pid is not None:
            on_pid(transport.get_pid())
    process = asyncio.subprocess.Process(transport, protocol, loop)
    stdout, _ = await asyncio.wait_for(process.communicate(stdin.encode()), 60)
    mark("done")
    return dict(take_marks()), stdout


def probe_protocol(protocol: type[asyncio.SubprocessProtocol]) -> None:
    """Mark the pipes' and the exit's callbacks of `protocol` (a class of this process)."""
    connection_made = protocol.connection_made
    pipe_data_received = protocol.pipe_data_received
    pipe_connection_lost = protocol.pipe_connection_lost
    process_exited = protocol.process_exited

    def probed_connection_made(self: Any, transport: Any) -> None:
        mark("spawned")
        self._bench_first = True
        connection_made(self, transport)

    def probed_pipe_data_received(self: Any, fd: int, data: bytes) -> None:
        if fd == 1 and getattr(self, "_bench_first", False):
            self._bench_first = False
            mark("first_byte")
        pipe_data_received(self, fd, data)

    def probed_pipe_connection_lost(self: Any, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            mark("stdout_eof")
        pipe_connection_lost(self, fd, exc)

    def probed_process_exited(self: Any) -> None:
        mark("exited")
        process_exited(self)

    protocol.connection_made = probed_connection_made  # type: ignore[method-assign]
    protocol.pipe_data_received = probed_pipe_data_received  # type: ignore[method-assign]
    protocol.pipe_connection_lost = probed_pipe_connection_lost  # type: ignore[method-assign]
    protocol.process_exited = probed_process_exited  # type: ignore[method-assign]


class ProbedStreamProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's own protocol of `create_subprocess_exec`, with the timeline's marks."""


probe_protocol(ProbedStreamProtocol)


if __name__ == "__main__":
    install()
    from agent_server.__main__ import main

    sys.exit(main(["serve"]))

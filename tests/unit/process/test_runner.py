"""The runner against real subprocesses: lines, stdin, env, exits, kills and reaping."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent_server.process.group import enable_child_subreaper, use_pidfd_child_watcher
from agent_server.process.runner import ProcessResult, run_process

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

SLEEP = shutil.which("sleep") or "/bin/sleep"
BASE_ENV = {"PATH": os.defpath}

# A leader that starts a grandchild `sleep` (sharing its stdout and stderr unless
# told otherwise), writes the grandchild's pid to argv[1], says "ready", then either
# lingers or exits. argv[2] is a comma-separated set of options.
FAMILY = textwrap.dedent(
    f"""
    import os, signal, subprocess, sys, time
    options = set(sys.argv[2].split(","))
    if "ignore-term" in options:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the grandchild
    out = subprocess.DEVNULL if "grandchild-no-pipes" in options else None
    grandchild = subprocess.Popen([{SLEEP!r}, "30"], stdout=out, stderr=out)
    with open(sys.argv[1], "w") as pid_file:
        pid_file.write(str(grandchild.pid))
    print("ready", flush=True)
    if "exit" not in options:
        time.sleep(30)
    """
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True, scope="module")
def _subreaper() -> None:
    # Orphaned grandchildren must come to this process to be reaped: PID 1 of a
    # sandbox may not reap at all, and the server enables the same at boot.
    enable_child_subreaper()


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *args]


def family(tmp_path: Path, *options: str) -> tuple[list[str], Path]:
    pid_file = tmp_path / "grandchild.pid"
    return python(FAMILY, str(pid_file), ",".join(options) or "-"), pid_file


def process_state(pid: int) -> str | None:
    """The /proc state letter of pid, or None when it no longer exists at all."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return None
    return stat.rpartition(b")")[2].split()[0].decode()


async def run(
    argv: list[str],
    *,
    env: Mapping[str, str] = BASE_ENV,
    cwd: str | Path = "/",
    stdin: bytes = b"",
    timeout_s: float = 10.0,
    cancel: asyncio.Event | None = None,
    on_line: Callable[[bytes], None] | None = None,
    **kwargs: Any,
) -> tuple[ProcessResult, list[bytes]]:
    lines: list[bytes] = []

    def collect(line: bytes) -> None:
        lines.append(line)
        if on_line is not None:
            on_line(line)

    result = await run_process(
        argv,
        env=env,
        cwd=cwd,
        stdin=stdin,
        timeout_s=timeout_s,
        on_line=collect,
        cancel=cancel if cancel is not None else asyncio.Event(),
        **kwargs,
    )
    return result, lines


async def test_lines_arrive_in_order_and_the_exit_is_normal() -> None:
    """Every stdout line reaches on_line in order, an unterminated last one too."""
    spawned: list[int] = []
    result, lines = await run(
        python(
            r"""
            import sys
            for i in range(1000):
                sys.stdout.write(f"line {i}\n")
            sys.stdout.write("\nlast without newline")
            """
        ),
        on_spawn=spawned.append,
    )
    assert lines == [f"line {i}".encode() for i in range(1000)] + [b"", b"last without newline"]
    assert result.facts.exit_code == 0
    assert not (result.facts.timed_out or result.facts.terminated or result.facts.spawn_failed)
    assert spawned == [result.pid]
    assert result.pid is not None
    assert process_state(result.pid) is None


async def test_stdin_is_delivered_and_closed() -> None:
    """The child reads all of stdin (more than a pipe buffer) up to EOF."""
    payload = b"prompt\n" * 100_000
    result, lines = await run(
        python("import sys; print(len(sys.stdin.buffer.read()))"), stdin=payload
    )
    assert lines == [str(len(payload)).encode()]
    assert result.facts.exit_code == 0


async def test_a_child_that_never_reads_stdin_is_not_an_error() -> None:
    """A broken stdin pipe is ignored."""
    result, _ = await run(python("pass"), stdin=b"x" * 1_000_000)
    assert result.facts.exit_code == 0


@pytest.mark.parametrize(
    ("code", "exit_code"),
    [
        ("import sys; sys.exit(0)", 0),
        ("import sys; sys.exit(3)", 3),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
    ],
    ids=["success", "failure", "killed-by-signal"],
)
async def test_exit_code_is_reported(code: str, exit_code: int) -> None:
    """The exit status is the leader's, negative for a signal."""
    result, _ = await run(python(code))
    assert result.facts.exit_code == exit_code


async def test_env_is_exactly_the_given_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing of the server's own environment reaches the child."""
    monkeypatch.setenv("AGENT_SERVER_RUNNER_LEAK_CHECK", "must-not-leak")
    env = {"PATH": os.defpath, "ONLY": "this one"}
    # /proc/self/environ is what exec received, before Python adds anything.
    result, lines = await run(
        python(
            r"""
            import sys
            with open("/proc/self/environ", "rb") as f:
                sys.stdout.buffer.write(f.read().replace(b"\0", b"\n"))
            """
        ),
        env=env,
    )
    assert result.facts.exit_code == 0
    assert sorted(lines) == sorted(f"{k}={v}".encode() for k, v in env.items())


async def test_cwd_is_the_given_directory(tmp_path: Path) -> None:
    """The child starts in cwd."""
    _, lines = await run(python("import os; print(os.getcwd())"), cwd=tmp_path)
    assert lines == [str(tmp_path.resolve()).encode()]


@pytest.mark.parametrize("kind", ["missing", "not-executable", "not-a-directory", "not-on-path"])
async def test_an_unusable_command_is_a_spawn_failure(tmp_path: Path, kind: str) -> None:
    """A missing or non-executable command gives spawn_failed, not an exception."""
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    command = {
        "missing": str(tmp_path / "no-such-cli"),
        "not-executable": str(script),
        "not-a-directory": str(script / "cli"),
        "not-on-path": "agent-server-no-such-cli",
    }[kind]
    result, lines = await run([command], env={"PATH": str(tmp_path)})
    assert result.facts.spawn_failed
    assert result.facts.exit_code is None
    assert result.pid is None
    assert lines == []


async def test_timeout_escalates_to_sigkill_and_kills_the_grandchild(tmp_path: Path) -> None:
    """A group that ignores SIGTERM is SIGKILLed after the grace, grandchild included."""
    argv, pid_file = family(tmp_path, "ignore-term")
    started = time.monotonic()
    result, lines = await run(argv, timeout_s=2.5, kill_grace_s=0.2)
    elapsed = time.monotonic() - started
    assert lines == [b"ready"]
    assert result.facts.timed_out
    assert not result.facts.terminated
    assert result.facts.exit_code == -signal.SIGKILL
    assert 2.5 <= elapsed < 6
    assert process_state(int(pid_file.read_text())) is None


async def test_cancel_event_kills_the_group(tmp_path: Path) -> None:
    """Setting cancel SIGTERMs the leader and the grandchild; the turn is terminated."""
    cancel = asyncio.Event()
    argv, pid_file = family(tmp_path)
    result, _ = await run(argv, cancel=cancel, on_line=lambda _: cancel.set())
    assert result.facts.terminated
    assert not result.facts.timed_out
    assert result.facts.exit_code == -signal.SIGTERM
    assert process_state(int(pid_file.read_text())) is None


async def test_cancelling_the_run_kills_and_reaps_before_it_ends(tmp_path: Path) -> None:
    """A cancelled run_process (cancelled twice, mid-grace) still kills and reaps all."""
    ready = asyncio.Event()
    spawned: list[int] = []
    argv, pid_file = family(tmp_path, "ignore-term")
    task = asyncio.ensure_future(
        run(argv, on_line=lambda _: ready.set(), on_spawn=spawned.append, kill_grace_s=0.5)
    )
    with anyio.fail_after(10):
        await ready.wait()
    task.cancel()
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert process_state(spawned[0]) is None
    assert process_state(int(pid_file.read_text())) is None


async def test_an_anyio_cancel_scope_kills_and_reaps_without_spinning(tmp_path: Path) -> None:
    """Starlette-style scope cancellation (re-delivered at every await) still reaps, idly."""
    spawned: list[int] = []
    argv, pid_file = family(tmp_path, "ignore-term")
    cpu_before = time.process_time()
    with anyio.CancelScope() as scope:
        await run(argv, on_line=lambda _: scope.cancel(), on_spawn=spawned.append, kill_grace_s=0.5)
    assert scope.cancelled_caught
    # The grace is waited, not busy-looped.
    assert time.process_time() - cpu_before < 0.4
    assert process_state(spawned[0]) is None
    assert process_state(int(pid_file.read_text())) is None


@pytest.mark.parametrize("options", [(), ("grandchild-no-pipes",)], ids=["pipes", "no-pipes"])
async def test_a_grandchild_left_behind_by_a_normal_exit_is_killed(
    tmp_path: Path, options: tuple[str, ...]
) -> None:
    """The leader exits 0 leaving a grandchild (holding stdout or not): it is killed."""
    argv, pid_file = family(tmp_path, "exit", *options)
    started = time.monotonic()
    result, lines = await run(argv)
    # Far below the 2 s drain bound: the group's death closes the pipes at once.
    assert time.monotonic() - started < 1.5
    assert lines == [b"ready"]
    assert result.facts.exit_code == 0
    assert not (result.facts.timed_out or result.facts.terminated)
    assert process_state(int(pid_file.read_text())) is None


async def test_an_on_line_error_kills_the_group_and_is_raised(tmp_path: Path) -> None:
    """A failing consumer does not leave the process running."""
    spawned: list[int] = []
    argv, pid_file = family(tmp_path)

    def explode(line: bytes) -> None:
        msg = "parser broke"
        raise RuntimeError(msg)

    with pytest.raises(RuntimeError, match="parser broke"):
        await run(argv, on_line=explode, on_spawn=spawned.append)
    assert process_state(spawned[0]) is None
    assert process_state(int(pid_file.read_text())) is None


async def test_lines_over_the_limit_are_dropped() -> None:
    """A line of exactly max_line_bytes is kept, one byte more is dropped."""
    _, lines = await run(
        python(r"import sys; sys.stdout.write('12345\n123456\nabc\n1234567')"),
        max_line_bytes=5,
    )
    assert lines == [b"12345", b"abc"]


async def test_a_huge_line_is_dropped_without_being_held() -> None:
    """A 50 MB line is skipped in chunks: later lines arrive, memory stays small."""
    code = r"""
        import sys
        out = sys.stdout.buffer
        out.write(b"first\n")
        for _ in range(50):
            out.write(b"x" * (1 << 20))
        out.write(b"\nafter\n")
        out.write(b"y" * (2 << 20))  # unterminated and over the limit at EOF
        """
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        _, lines = await run(python(code), max_line_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == [b"first", b"after"]
    assert peak < 8 << 20


async def test_stderr_keeps_a_bounded_tail_of_whole_lines() -> None:
    """Only the end of stderr is kept, decoded leniently, from its first whole line on."""
    code = r"import sys; sys.stderr.buffer.write(b'e' * 1_000_000 + b'\nx' * 200 + b'\xffEND')"
    result, _ = await run(python(code), stderr_tail_bytes=1000)
    assert result.facts.stderr == "x\n" * 199 + "x\ufffdEND"


async def test_a_cut_stderr_line_is_dropped_whole() -> None:
    """Where the tail starts mid-line (maybe mid-secret), that partial line never shows."""
    secret_end = "SECRETSUFFIX0123456789"
    code = f"import sys; sys.stderr.write('A' * 5000 + {secret_end!r} + '\\nnext line')"
    result, _ = await run(python(code), stderr_tail_bytes=100)
    assert result.facts.stderr == "next line"


def _waitpid_threads_while_a_child_runs(*, pidfd: bool) -> tuple[set[str], ProcessResult]:
    """Thread names seen while a child runs (asyncio's threaded watcher names its own)."""
    previous = asyncio.get_child_watcher()
    seen: set[str] = set()

    async def one_turn() -> ProcessResult:
        if pidfd:
            assert use_pidfd_child_watcher()
        result, _ = await run(
            python("import sys; sys.exit(3)"),
            on_spawn=lambda _pid: seen.update(t.name for t in threading.enumerate()),
        )
        return result

    try:
        result = asyncio.run(one_turn())
    finally:
        asyncio.set_child_watcher(previous)
    # 3.11.2 names the threads `waitpid-N`, later 3.11 releases `asyncio-waitpid-N`.
    return {name for name in seen if name.startswith(("asyncio-waitpid", "waitpid-"))}, result


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12+ chooses the pidfd watcher itself")
def test_the_pidfd_watcher_spawns_without_a_thread_per_child() -> None:
    """The default watcher starts a waitpid thread per child; the pidfd one starts none."""
    threaded, _ = _waitpid_threads_while_a_child_runs(pidfd=False)
    with_pidfd, result = _waitpid_threads_while_a_child_runs(pidfd=True)
    assert threaded  # the baseline this test would otherwise not prove anything against
    assert with_pidfd == set()
    assert result.facts.exit_code == 3


CHILDREN_OF_SELF = """
    import os, subprocess, sys, time
    from agent_server.process.group import children_of_self

    assert children_of_self() == set(), "no child yet"
    child = subprocess.Popen([sys.argv[1], "30"])
    assert children_of_self() == {child.pid}, "a running child"
    child.kill()
    while open(f"/proc/{child.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.01)
    assert children_of_self() == {child.pid}, "a zombie child is still a child"
    assert os.waitpid(child.pid, os.WNOHANG)[0] == child.pid, "and it was left to collect"
    assert children_of_self() == set(), "none once it is collected"
    print("ok")
"""


def test_children_of_self_lists_living_and_zombie_children_and_collects_none() -> None:
    """The `waitid` that finds no child at all collects none (`WNOWAIT`).

    In a fresh interpreter: pytest's process may have children of its own.
    """
    done = subprocess.run(
        python(CHILDREN_OF_SELF, SLEEP), capture_output=True, text=True, timeout=20, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr

"""Figure 0: where a turn's milliseconds go, through the server and in a direct spawn.

Every step is a `time.monotonic_ns()` mark (CLOCK_MONOTONIC: one clock for every
process of the machine), taken by whoever sees it first:

- the bench's client: the request is sent, the answer is read;
- the server, run under `bench/probed_server.py` (probes wrapped around its hot path
  from outside; the server's own code has none): see that module for each mark;
- the bench process for the direct spawn: the same asyncio spawn as figure 1's
  direct side, with the same marks on its transport and protocol;
- the stand-in CLI itself: `main` entered, first event written, result written
  (`bench_clock_ns` in its result event).

Turns run one at a time, server and direct interleaved in alternating order, and the
table gives the median and p95 of every step on each side. The phases (before the
CLI is exec'd, the CLI's own life until its exit is observed, after that) add up to
the turn; their server-minus-direct differences are where the overhead lives.

After each round the client also times the HTTP exchange alone: it stays idle as
long as the last turn's CLI lived, then posts the same body to the harness's echo,
which answers as many bytes as the turn's answer had, from uvicorn, before any code
of the server's. That is what the turn's request and answer cost with no turn: both
processes' wake-ups, uvicorn's parsing and writing, the client's reading.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.client import LoopbackClient
from bench.plan import Plan
from bench.probed_server import DIRECT_PATH, ECHO_PATH, PROBES_PATH, direct_spawn, probe_spawn
from bench.report import Figure, median, percentile
from bench.server import PROBED_SERVER, BenchServer, Workspace
from bench.turn_overhead import PROMPT, TARGET_RATIO, server_turn

Marks = Mapping[str, int]


@dataclass(frozen=True)
class Step:
    """One interval of the timeline: from one mark to the next, on one side or both."""

    label: str
    server: tuple[str, str] | None
    direct: tuple[str, str] | None


def _both(label: str, start: str, end: str) -> Step:
    return Step(label, (start, end), (start, end))


def _server(label: str, start: str, end: str) -> Step:
    return Step(label, (start, end), None)


STEPS = (
    _server("request on the wire, server wakes", "sent", "received"),
    _server("headers parsed, ASGI task starts", "received", "app"),
    _server("auth, routing, body read and validated", "app", "parsed"),
    Step("turn bookkeeping, spawn env built", ("parsed", "env"), ("start", "fork")),
    _server("argv, exec-size check, up to fork", "env", "fork"),
    _both("fork/exec (Popen)", "fork", "exec"),
    _both("pipes connected", "exec", "spawned"),
    _both("CLI: interpreter start-up", "exec", "cli_main"),
    _both("CLI: reads stdin, first event", "cli_main", "cli_first"),
    _both("first event written -> first byte read", "cli_first", "first_byte"),
    _both("CLI: its work, to the result event", "cli_first", "cli_last"),
    _both("CLI: result written -> its stdout closes", "cli_last", "stdout_eof"),
    _both("stdout closed -> exit observed", "stdout_eof", "exited"),
    _server("reap group, sweep, close pipes", "exited", "ended"),
    _server("classify, build the answer", "ended", "answering"),
    _server("redact and serialise the answer", "answering", "serialised"),
    _server("starlette, access log: first write", "serialised", "head"),
    _server("the answer's last write", "head", "written"),
    Step("answer on the wire, client reads it", ("written", "done"), ("exited", "done")),
)
"""The direct side has no HTTP: its only rows are the spawn's and the CLI's."""

PHASES = (
    ("before exec", ("sent", "exec"), ("start", "exec")),
    ("CLI life until its exit is seen", ("exec", "exited"), ("exec", "exited")),
    ("after the exit", ("exited", "done"), ("exited", "done")),
    ("whole turn", ("sent", "done"), ("start", "done")),
)


async def direct_turn_marked(workspace: Workspace, prompt: str) -> dict[str, int]:
    """Figure 1's direct turn from the bench process, marked."""
    marks, stdout = await direct_spawn(
        workspace.argv(), workspace.spawn_env(), str(workspace.workdir), prompt
    )
    marks.update(_cli_marks(json.loads(stdout.splitlines()[-1])))
    return marks


async def in_server_turn_marked(
    client: LoopbackClient, workspace: Workspace, prompt: str
) -> dict[str, int]:
    """The same direct spawn, made by the server's process (the harness's route)."""
    spec = {
        "argv": workspace.argv(),
        "env": workspace.spawn_env(),
        "cwd": str(workspace.workdir),
        "stdin": prompt,
    }
    answer = (await client.post(DIRECT_PATH, spec)).json()
    marks: dict[str, int] = answer["marks"]
    marks.update(_cli_marks(json.loads(answer["stdout"].splitlines()[-1])))
    return marks


async def server_turn_marked(client: LoopbackClient, prompt: str) -> dict[str, int]:
    """One server turn with the client's marks, the server's and the CLI's (and the
    answer's size, `answer_bytes`)."""
    sent = time.monotonic_ns()
    answer = await server_turn(client, prompt)
    done = time.monotonic_ns()
    probes = await client.get(PROBES_PATH)
    marks = {"sent": sent, "done": done, "answer_bytes": len(answer.body), **dict(probes.json())}
    marks.update(_cli_marks(answer.json()["execution_log"][-1]))
    return marks


async def http_exchange_marked(
    client: LoopbackClient, prompt: str, turn: Marks, answer_bytes: int
) -> dict[str, int]:
    """The exchange of a turn without the turn: idle as long as `turn`'s CLI lived, then
    the same body to the echo, answered with `answer_bytes` bytes."""
    await asyncio.sleep((turn["exited"] - turn["exec"]) / 1e9)
    sent = time.monotonic_ns()
    answer = await client.post(f"{ECHO_PATH}?bytes={answer_bytes}", {"message": prompt})
    done = time.monotonic_ns()
    if answer.status != 200 or len(answer.body) != answer_bytes:
        msg = f"echo failed: {answer.status}, {len(answer.body)} of {answer_bytes} bytes"
        raise RuntimeError(msg)
    return {"sent": sent, "done": done}


def _cli_marks(result: Mapping[str, object]) -> dict[str, int]:
    main_ns, first_ns, last_ns = result["bench_clock_ns"]  # type: ignore[misc]
    return {"cli_main": main_ns, "cli_first": first_ns, "cli_last": last_ns}


def _ms(turns: Sequence[Marks], span: tuple[str, str] | None) -> list[float]:
    if span is None:
        return []
    start, end = span
    return [(t[end] - t[start]) / 1e6 for t in turns if start in t and end in t]


def _cell(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{median(values):7.3f} {percentile(values, 0.95):7.3f}"


@dataclass(frozen=True)
class Sides:
    """The marked turns of each side."""

    server: list[dict[str, int]]
    """Turns through the server (HTTP, the turn's code)."""
    direct: list[dict[str, int]]
    """Direct spawns from the bench process."""
    in_server: list[dict[str, int]]
    """The same direct spawns, made by the server's process."""
    exchange: list[dict[str, int]]
    """The HTTP exchange alone, after each round (`sent`, `done`)."""

    def columns(self) -> list[tuple[list[dict[str, int]], bool]]:
        """(turns, uses the server's spans) for each column, in print order."""
        return [(self.server, True), (self.direct, False), (self.in_server, False)]


def render_table(sides: Sides) -> str:
    """The timeline as printed: a row a step, then the phases and their differences."""
    width = 44
    header = (
        f"  {'step (ms: median p95)':<{width}} {'server turn':>15}   {'direct spawn':>15}"
        f"   {'direct, from server':>19}"
    )
    rule = "  " + "-" * (len(header) - 2)
    lines = [
        f"timeline of one turn: {len(sides.server)} server turns, {len(sides.direct)} direct "
        f"spawns from the bench, {len(sides.in_server)} from the server's process",
        header,
        rule,
    ]

    def row(label: str, server: tuple[str, str] | None, direct: tuple[str, str] | None) -> str:
        cells = [_cell(_ms(t, server if own else direct)) for t, own in sides.columns()]
        return f"  {label:<{width}} {cells[0]:>15}   {cells[1]:>15}   {cells[2]:>19}"

    lines += [row(step.label, step.server, step.direct) for step in STEPS]
    lines.append(rule)
    for label, server_span, direct_span in PHASES:
        lines.append(row(label, server_span, direct_span))
    exchange = _cell(_ms(sides.exchange, ("sent", "done")))
    lines.append(f"  {'the HTTP exchange alone (echo, no turn)':<{width}} {exchange:>15}")
    lines += [
        "",
        f"  {'server turn minus (ms)':<{width}} {'direct spawn':>15}   {'direct, from server':>19}",
        f"  {'':<{width}} {'medians':>15}   {'median of pairs':>19}",
    ]
    for label, server_span, direct_span in PHASES:
        gap, own = phase_gaps(sides, server_span, direct_span)
        lines.append(f"  {label:<{width}} {gap:>+15.3f}   {own:>+19.3f}")
    return "\n".join(lines)


def phase_gaps(
    sides: Sides, server_span: tuple[str, str], direct_span: tuple[str, str]
) -> tuple[float, float]:
    """A phase of the server turn minus the same phase of each direct spawn.

    Against the bench's direct spawn: the difference of the medians. Against the
    direct spawn from the server's own process: the median of the differences of
    the turns run next to each other. That one is the cost of the server's code
    alone: a CLI runs on the CPU of the process that spawned it, and on this VM the
    two CPUs' speeds drift apart for seconds at a time (the CLI rows show it).
    """
    server = _ms(sides.server, server_span)
    gap = median(server) - median(_ms(sides.direct, direct_span))
    own = median([s - d for s, d in zip(server, _ms(sides.in_server, direct_span), strict=False)])
    return gap, own


async def measure(workspace: Workspace, plan: Plan) -> list[Figure]:
    """Interleaved marked turns on each side; the table and the phase differences."""
    sides = Sides([], [], [], [])
    undo = probe_spawn()
    try:
        with BenchServer(workspace, command=PROBED_SERVER) as server:
            async with server.client() as client:
                await client.get(PROBES_PATH)  # forget the health checks' marks
                for index in range(plan.warmup_pairs + plan.timeline_turns):
                    order = ("server", "direct", "in_server")
                    shift = index % 3
                    for side in order[shift:] + order[:shift]:
                        if side == "server":
                            marks = await server_turn_marked(client, PROMPT)
                        elif side == "direct":
                            marks = await direct_turn_marked(workspace, PROMPT)
                        else:
                            marks = await in_server_turn_marked(client, workspace, PROMPT)
                        if index >= plan.warmup_pairs:
                            getattr(sides, side).append(marks)
                        if side == "server":
                            turn = marks
                    exchange = await http_exchange_marked(
                        client, PROMPT, turn, turn["answer_bytes"]
                    )
                    if index >= plan.warmup_pairs:
                        sides.exchange.append(exchange)
    finally:
        undo()
    figures = []
    for label, server_span, direct_span in PHASES:
        gap, own = phase_gaps(sides, server_span, direct_span)
        figures.append(
            Figure(
                f"0 timeline: {label}, server - direct spawn from the server (pairs)",
                own,
                "ms",
                note=(
                    f"server {median(_ms(sides.server, server_span)):.2f} ms; "
                    f"minus the bench's direct spawn (medians) {gap:+.2f} ms"
                ),
            )
        )
    before, after = phase_gaps(sides, *PHASES[0][1:])[1], phase_gaps(sides, *PHASES[2][1:])[1]
    figures.append(
        Figure(
            "0 the server's own work per turn (before exec + after the exit, pairs)",
            before + after,
            "ms",
            note=f"{before:.2f} + {after:.2f} ms; the CLI's life is the spawn's own",
        )
    )
    whole = PHASES[-1]
    server_ms, own_ms = _ms(sides.server, whole[1]), _ms(sides.in_server, whole[2])
    ratio = median([s / d for s, d in zip(server_ms, own_ms, strict=False)])
    exchange = median(_ms(sides.exchange, ("sent", "done")))
    # The server's own work without the exchange, over the CLI's life as the server's
    # process spawns it: the CLI's own noise (its life, pair to pair) left out.
    code = before + after - exchange
    code_ratio = 1 + code / median(own_ms)
    figures.append(
        Figure.limited(
            "0 turn: server / direct spawn from the server's process (median of pairs)",
            ratio,
            "x",
            TARGET_RATIO,
            note=(
                f"figure 1 without the CPUs' drift: the same CLI, spawned by the same "
                f"process; {median(server_ms):.1f} vs {median(own_ms):.1f} ms"
            ),
            details={
                "table": render_table(sides),
                "server": sides.server,
                "direct": sides.direct,
                "in_server": sides.in_server,
                "exchange": sides.exchange,
            },
        )
    )
    figures.append(
        Figure(
            "0 the HTTP exchange alone: the turn's request and answer, no turn (echo)",
            exchange,
            "ms",
            note="uvicorn, both processes' wake-ups and the client, after the same idle time",
        )
    )
    figures.append(
        Figure.limited(
            "0 the server's code: (own work - that exchange) / direct spawn from the server",
            code_ratio,
            "x",
            TARGET_RATIO,
            note=(
                f"1 + ({before + after:.2f} - {exchange:.2f} ms) / {median(own_ms):.1f} ms: "
                "Starlette, auth, the turn, its answer"
            ),
        )
    )
    return figures

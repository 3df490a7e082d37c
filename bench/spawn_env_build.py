"""Figure 5: building a spawn env over a 5,000-line `.env`, cached vs parsed every time.

- uncached: a fresh `DotenvFile(path).read()` per call, i.e. one python-dotenv parse;
- cached: one `DotenvFile`, the file unchanged: `read()` costs one `stat`;
- `build_spawn_env(...)`: the five layers over the cached values;
- `SpawnEnvBuilder.build(...)`: what a turn really pays (cached read, the `.env`
  credentials offered to the redactor, the build, the once-per-key warners).

The file's mtime is set a minute into the past: a file modified within the racy
window (`RACY_WINDOW_NS`) is re-parsed on purpose, and a benchmark must not hit that.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr

from agent_server.config import Settings
from agent_server.services import Services
from agent_server.spawn_env.dotenv_file import DotenvFile
from agent_server.spawn_env.layers import PerSpawn, build_spawn_env
from agent_server.spawn_env.per_spawn import spawn_credential
from bench.plan import Plan
from bench.report import Figure

ENV_LINES = 5000
_MAX_CALLS = 1_000_000


def write_env_file(path: Path, lines: int = ENV_LINES) -> None:
    """A `.env` of `lines` lines: plain, `export`, quoted, comments, a few credentials."""
    rows = []
    for index in range(lines):
        if index % 100 == 0:
            rows.append(f"# section {index // 100}")
        elif index % 10 == 1:
            rows.append(f"export BENCH_EXPORTED_{index}=exported-value-{index}")
        elif index % 10 == 2:
            rows.append(f'BENCH_QUOTED_{index}="quoted value {index} with spaces"')
        elif index % 500 == 3:
            rows.append(f"BENCH_SERVICE_{index}_TOKEN=tok-{index:06d}-abcdefghijklmnop")
        else:
            rows.append(f"BENCH_PLAIN_{index}=plain-value-{index}-0123456789")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    past = time.time() - 60
    os.utime(path, (past, past))


def per_call_us(call: Callable[[], object], budget_s: float) -> tuple[float, int]:
    """Mean microseconds per call over at most `budget_s` (and `_MAX_CALLS` calls)."""
    call()  # warm
    calls = 0
    started = time.perf_counter()
    deadline = started + budget_s
    while calls < _MAX_CALLS:
        for _ in range(10):
            call()
        calls += 10
        if time.perf_counter() >= deadline:
            break
    return (time.perf_counter() - started) / calls * 1e6, calls


def measure(plan: Plan) -> list[Figure]:
    """Per-call microseconds of each way to get a spawn env, and the cache's speed-up."""
    with tempfile.TemporaryDirectory(prefix="agent-server-bench-env-") as root:
        home = Path(root)
        env_file = home / ".env"
        write_env_file(env_file)
        uncached_us, uncached_n = per_call_us(
            lambda: DotenvFile(env_file).read(), plan.env_budget_s
        )
        cached = DotenvFile(env_file)
        values = cached.read()
        cached_us, cached_n = per_call_us(cached.read, plan.env_budget_s)
        if cached.read() is not values:
            msg = "the cached DotenvFile parsed the unchanged file again"
            raise RuntimeError(msg)

        state_dir = home / "state"
        state_dir.mkdir(mode=0o700)
        settings = Settings.from_environ(
            {
                "PATH": "/usr/bin:/bin",
                "HOME": str(home),
                "LANG": "C.UTF-8",
                "CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-bench-baseline-token",
                "AGENT_SERVER_ENV_FILE": str(env_file),
                "AGENT_SERVER_STATE_DIR": str(state_dir),
                "AGENT_SERVER_INSECURE_NO_AUTH": "1",
            }
        )
        services = Services.build(settings, serving=False)
        state = services.store.current
        layer = spawn_credential("bench-execution-id", None).layer
        overrides = {**state.overrides, "CLAUDE_CODE_OAUTH_TOKEN": SecretStr("sk-ant-oat01-x")}
        build_us, build_n = per_call_us(
            lambda: build_spawn_env(state.baseline, values, overrides, PerSpawn(layer.values)),
            plan.env_budget_s,
        )
        full_us, full_n = per_call_us(
            lambda: asyncio.run(services.spawn_envs.build(state.baseline, state.overrides, layer)),
            plan.env_budget_s,
        )
        full_uncached_us = uncached_us + build_us
    speedup = uncached_us / cached_us
    return [
        Figure(
            f"5 .env read, {ENV_LINES} lines, uncached (parse)",
            uncached_us,
            "us",
            note=f"python-dotenv parse, {len(values)} keys, {uncached_n} calls",
            details={"calls": uncached_n, "keys": len(values)},
        ),
        Figure(
            "5 .env read, cached (one stat)",
            cached_us,
            "us",
            ratio=speedup,
            note=f"speed-up over a parse: {speedup:,.0f}x",
            details={"calls": cached_n, "speedup": speedup},
        ),
        Figure(
            "5 build_spawn_env over it",
            build_us,
            "us",
            note="five layers over the cached values",
            details={"calls": build_n},
        ),
        Figure(
            "5 SpawnEnvBuilder.build (cached read + redactor + build)",
            full_us,
            "us",
            ratio=full_uncached_us / full_us,
            note=f"vs parse + build: {full_uncached_us / full_us:,.0f}x faster",
            details={
                "calls": full_n,
                "uncached_equivalent_us": full_uncached_us,
                "speedup_vs_parse_plus_build": full_uncached_us / full_us,
            },
        ),
    ]

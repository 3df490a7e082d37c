"""Recorded CLI output, fed through a runtime's parser as the runner would feed it.

One loader for the reference Claude Code transcripts and our own real-CLI captures of
all three CLIs, so every table test reads a transcript the same way.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from agent_server.process.runner import ProcessFacts
from agent_server.runtimes.base import StreamParser
from agent_server.runtimes.stream import TurnStream
from tests.support.real_clis import CODEX, GEMINI, RealCli

REPO = Path(__file__).resolve().parents[2]
REFERENCE_FIXTURES = REPO / "tests" / "fixtures" / "claude-code-2.1.328"
CAPTURED_FIXTURES = REPO / "tests" / "fixtures" / "claude-code-2.1.328-captured"
SAMPLES = REPO / "tests" / "fixtures"


def captures_of(cli: RealCli) -> Path:
    """The folder of a CLI's captures at its pinned version (`capture_fixtures`)."""
    return SAMPLES / f"{cli.name}-{cli.version}"


CODEX_FIXTURES = captures_of(CODEX)
GEMINI_FIXTURES = captures_of(GEMINI)


def replay(parser: StreamParser, stdout: Path) -> tuple[TurnStream, list[bool]]:
    """Feed every line of `stdout` to `parser`; return its stream and what `feed` said."""
    finals = [parser.feed(line) for line in stdout.read_bytes().splitlines()]
    return parser.stream, finals


def stderr_beside(stdout: Path) -> str:
    """The `NAME.stderr.txt` recorded beside `NAME.jsonl` / `NAME.stdout.jsonl`, or ''."""
    name = stdout.name.removesuffix(".jsonl").removesuffix(".stdout")
    path = stdout.with_name(f"{name}.stderr.txt")
    return path.read_text() if path.exists() else ""


def load_scenario(
    directory: Path, name: str, parser: StreamParser
) -> tuple[TurnStream, ProcessFacts]:
    """A recorded Claude Code scenario (stdout, stderr, exit code) as the classifier gets it."""
    meta = json.loads((directory / f"{name}.json").read_text())
    stdout = directory / f"{name}.stdout.jsonl"
    stream, _ = replay(parser, stdout)
    return stream, ProcessFacts(exit_code=meta["exit_code"], stderr=stderr_beside(stdout))


def captured_at(directory: Path, name: str) -> datetime:
    """When a Codex or Gemini CLI capture ran (its `NAME.json`)."""
    meta = json.loads((directory / f"{name}.json").read_text())
    return datetime.fromisoformat(meta["captured_at"])

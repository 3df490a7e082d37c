"""Record real Codex and Gemini CLI transcripts against the loopback API stand-ins.

    .venv/bin/python -m tests.support.capture_fixtures codex|gemini [OUTDIR]

Each scenario runs the real CLI (`AGENT_SERVER_TEST_CODEX_BIN` / `..._GEMINI_BIN`, else
the pinned copy `make test` installs) exactly as the server spawns it: the adapter's
own argv and stdin, and for Gemini CLI the headless settings file the server writes
(as root; otherwise the same settings in the scenario's HOME). Fake credentials pick
the stand-in's answer. It writes `NAME.stdout.jsonl`, `NAME.stderr.txt` and
`NAME.json` per scenario and the folder's README, into
tests/fixtures/codex-<version> or tests/fixtures/gemini-cli-<version>.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from agent_server.runtimes.base import RuntimeAdapter, TurnSpec
from agent_server.runtimes.codex import CodexAdapter
from agent_server.runtimes.gemini import GeminiAdapter, headless_settings
from agent_server.spawn_env.spawn_files import SpawnFiles
from tests.support import gemini_api, openai_api
from tests.support.real_clis import CODEX, GEMINI, RealCli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
UNKNOWN_SESSION_ID = "3f0b6a2e-1111-4222-8333-944445555666"
PROMPT = "say hi"


@dataclass(frozen=True)
class Scenario:
    """One capture: fake credentials, the turn's fields, what it shows, how it runs."""

    name: str
    shows: str
    env: dict[str, str]
    turn: dict[str, str] = field(default_factory=dict)
    """TurnSpec fields: `model`, `resume_session_id`, `system_prompt`."""
    settings: bool = True
    """Gemini CLI: with the server's headless settings file."""
    skip_trust: bool = True
    """Gemini CLI: with `--skip-trust`."""


CODEX_SCENARIOS = (
    Scenario("success", "an API key served the turn", {"OPENAI_API_KEY": "sk-good-1"}),
    Scenario(
        "reconnected",
        "503 to the first five requests: four silent retries, one `Reconnecting... 1/5` "
        "error event, then the turn completes",
        {"OPENAI_API_KEY": "sk-flaky-1"},
    ),
    Scenario(
        "rate_limit_429",
        "429 rate_limit_exceeded: Codex retries, then `exceeded retry limit, last status: 429`",
        {"OPENAI_API_KEY": "sk-ratelimit-1"},
    ),
    Scenario(
        "usage_limit",
        "429 usage_limit_reached with resets_at: `You\u2019ve hit your usage limit. … try again "
        "at <local time>.` (a curly apostrophe)",
        {"OPENAI_API_KEY": "sk-usagelimit-1"},
    ),
    Scenario(
        "quota",
        "429 insufficient_quota: `Quota exceeded. Check your plan and billing details.`",
        {"OPENAI_API_KEY": "sk-nocredit-1"},
    ),
    Scenario(
        "auth_401",
        "401 invalid_api_key: five reconnects, then `unexpected status 401 Unauthorized`",
        {"OPENAI_API_KEY": "sk-badauth-1"},
    ),
    Scenario(
        "model_not_found",
        "404 model_not_found: ``The model `gpt-nonexistent-9` does not exist…``, after a "
        "warning item about its metadata",
        {"OPENAI_API_KEY": "sk-good-2"},
        {"model": openai_api.UNKNOWN_MODEL},
    ),
    Scenario(
        "server_error_500",
        "500: five reconnects, then `We\u2019re currently experiencing high demand…` (no status)",
        {"OPENAI_API_KEY": "sk-servererror-1"},
    ),
    Scenario(
        "unavailable_503",
        "503: five reconnects, then `unexpected status 503 Service Unavailable`",
        {"OPENAI_API_KEY": "sk-unavailable-1"},
    ),
    Scenario("missing_key", "no OPENAI_API_KEY: ``Missing environment variable: …``", {}),
)
"""The scenarios of tests/fixtures/codex-<version>."""

GEMINI_SCENARIOS = (
    Scenario("success", "an API key served the turn", {"GEMINI_API_KEY": "k-good-1"}),
    Scenario(
        "rate_limit_429",
        "429 RESOURCE_EXHAUSTED, a per-minute quota with RetryInfo 3600s: `Please retry in "
        "3600s.`, no JSON body, exit 173 (429 mod 256)",
        {"GEMINI_API_KEY": "k-ratelimit-1"},
    ),
    Scenario(
        "daily_quota_429",
        "429 RESOURCE_EXHAUSTED, a per-day quota: `You have exhausted your daily quota`, exit 173",
        {"GEMINI_API_KEY": "k-nocredit-1"},
    ),
    Scenario(
        "key_invalid_400",
        "400 API_KEY_INVALID (what a bad key gets): the JSON body in the result, exit 144",
        {"GEMINI_API_KEY": "k-badkey-1"},
    ),
    Scenario(
        "auth_401",
        "401 UNAUTHENTICATED: the JSON body in the result, exit 145",
        {"GEMINI_API_KEY": "k-badauth-1"},
    ),
    Scenario(
        "model_not_found",
        "404 NOT_FOUND: `models/gemini-nonexistent-9 is not found…`, exit 1",
        {"GEMINI_API_KEY": "k-good-2"},
        {"model": gemini_api.UNKNOWN_MODEL},
    ),
    Scenario(
        "server_error_500",
        "500 INTERNAL: the JSON body in the result, exit 244",
        {"GEMINI_API_KEY": "k-servererror-1"},
    ),
    Scenario(
        "unavailable_503",
        "503 UNAVAILABLE: `The model is overloaded`, no JSON body, exit 247",
        {"GEMINI_API_KEY": "k-unavailable-1"},
    ),
    Scenario(
        "missing_key", "no GEMINI_API_KEY: exit 41, `you must specify the GEMINI_API_KEY`", {}
    ),
    Scenario(
        "unknown_session_resume",
        "--resume <unknown uuid>: exit 42, `Error resuming session`",
        {"GEMINI_API_KEY": "k-good-3"},
        {"resume_session_id": UNKNOWN_SESSION_ID},
    ),
    Scenario(
        "invalid_auth_method",
        "GOOGLE_GEMINI_BASE_URL without the server's settings file: exit 41 `Invalid auth "
        "method selected.`",
        {"GEMINI_API_KEY": "k-good-4"},
        settings=False,
    ),
    Scenario(
        "untrusted_workdir",
        "without `--skip-trust`: exit 55 `Gemini CLI is not running in a trusted directory`",
        {"GEMINI_API_KEY": "k-good-5"},
        skip_trust=False,
    ),
)
"""The scenarios of tests/fixtures/gemini-cli-<version>."""


@dataclass(frozen=True)
class CliSet:
    """One CLI's capture: its real executable, adapter, stand-in and scenarios."""

    cli: RealCli
    adapter: RuntimeAdapter
    scenarios: tuple[Scenario, ...]
    model: str


SETS = {
    "codex": CliSet(CODEX, CodexAdapter(), CODEX_SCENARIOS, openai_api.MODEL),
    "gemini": CliSet(GEMINI, GeminiAdapter(), GEMINI_SCENARIOS, gemini_api.MODEL),
}


def version_of(executable: Path) -> str:
    """What `<cli> --version` says, its last word (`codex-cli 0.171.0` -> `0.171.0`)."""
    done = subprocess.run(
        [str(executable), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.split()[-1]


@contextmanager
def _stand_in(name: str) -> Iterator[openai_api.ResponsesApiStandIn | gemini_api.GeminiApiStandIn]:
    api = openai_api.ResponsesApiStandIn() if name == "codex" else gemini_api.GeminiApiStandIn()
    with api:
        yield api


def _env(
    api: openai_api.ResponsesApiStandIn | gemini_api.GeminiApiStandIn, root: Path
) -> dict[str, str]:
    """A minimal environment for the CLI, pointed at the stand-in."""
    home = root / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
    if isinstance(api, openai_api.ResponsesApiStandIn):
        env["CODEX_HOME"] = str(api.write_codex_home(root / "codex-home"))
    else:
        env["GOOGLE_GEMINI_BASE_URL"] = api.base_url
    return env


def capture(cli_set: CliSet, executable: Path, scenario: Scenario, outdir: Path) -> int:
    """Run one scenario as the server would spawn it; write its three files; its exit."""
    adapter = cli_set.adapter
    turn = {"model": cli_set.model, **scenario.turn}
    spec = TurnSpec(prompt=PROMPT, permission_mode="bypassPermissions", **turn)
    argv = adapter.argv(str(executable), spec)
    files = SpawnFiles.for_server()
    with tempfile.TemporaryDirectory() as tmp, _stand_in(cli_set.cli.name) as api:
        root = Path(tmp)
        env = _env(api, root) | scenario.env
        if not scenario.skip_trust:
            argv.remove("--skip-trust")
        if scenario.settings and files.base is not None:
            env = files.env_for(env, adapter.spawn_files(env))
        elif scenario.settings and cli_set.cli is GEMINI:  # not root: as the agent's own
            settings = root / "home" / ".gemini" / "settings.json"
            settings.parent.mkdir(parents=True)
            settings.write_text(json.dumps(headless_settings(env)))
        (root / "work").mkdir()
        captured_at = datetime.now(UTC)
        done = subprocess.run(
            argv,
            input=adapter.stdin(spec),
            env=env,
            cwd=root / "work",
            capture_output=True,
            timeout=300,
            check=False,
        )
        files.close()
    install = str(executable.parents[len(Path(cli_set.cli.executable).parts)])
    stderr = done.stderr.decode("utf-8", "replace").replace(install, "<install>")
    (outdir / f"{scenario.name}.stdout.jsonl").write_bytes(done.stdout)
    (outdir / f"{scenario.name}.stderr.txt").write_text(stderr)
    meta = {
        "scenario": scenario.name,
        "shows": scenario.shows,
        "exit_code": done.returncode,
        "captured_at": captured_at.isoformat(timespec="seconds"),
        "argv": [cli_set.cli.name.split("-")[0], *argv[1:]],
        "stdin": adapter.stdin(spec).decode(),
        "env": scenario.env,
        "env_names": sorted(env),
    }
    (outdir / f"{scenario.name}.json").write_text(json.dumps(meta, indent=2) + "\n")
    return done.returncode


README = """\
# Real {title} transcripts (CLI {version}), captured by this repo

Written by `python -m tests.support.capture_fixtures {set_name}` (do not edit by hand):
the real CLI run exactly as the server spawns it (the adapter's argv, the prompt on
stdin{headless}) against `{stand_in}`, the loopback stand-in of its API, with a fresh
HOME and fake credentials that choose the stand-in's answer. Three files a scenario:
`NAME.stdout.jsonl` (what it printed), `NAME.stderr.txt` (the install path replaced by
`<install>`) and `NAME.json` (exit code, when it ran, argv, stdin, the fake credentials, the
names of the environment). Session ids, timestamps and ports differ between captures.

To record them again (a new pinned version: the folder is named by it), after
`make test` has installed the pinned CLIs:

    .venv/bin/python -m tests.support.capture_fixtures {set_name}

| scenario | exit | shows |
| --- | --- | --- |
"""


def capture_set(set_name: str, outdir: Path | None = None) -> Path:
    """Record every scenario of `set_name` (`codex` or `gemini`); return the folder."""
    cli_set = SETS[set_name]
    executable = cli_set.cli.path()
    if executable is None:
        msg = f"the real {cli_set.cli.name} CLI is missing: set {cli_set.cli.env_variable}"
        raise FileNotFoundError(msg)
    version = version_of(executable)
    folder = outdir or FIXTURES / f"{cli_set.cli.name}-{version}"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for scenario in cli_set.scenarios:
        code = capture(cli_set, executable, scenario, folder)
        rows.append(f"| {scenario.name} | {code} | {scenario.shows} |\n")
    codex = set_name == "codex"
    head = README.format(
        title="Codex" if codex else "Gemini CLI",
        version=version,
        set_name=set_name,
        stand_in="tests/support/openai_api.py" if codex else "tests/support/gemini_api.py",
        headless="" if codex else " and the server's headless settings file",
    )
    (folder / "README.md").write_text(head + "".join(rows))
    return folder

"""Record real CLI transcripts against the loopback API stand-ins.

    .venv/bin/python -m tests.support.capture_fixtures reference|captured|codex|gemini [OUTDIR]

`codex` and `gemini` are recorded by `capture_codex_gemini`; the Claude Code sets here.

For each scenario of the set it runs the real CLI (``AGENT_SERVER_TEST_CLAUDE_BIN``,
else the copy `make test` installs in .cache/) as
``claude -p hi --output-format stream-json --verbose [args]`` with a fresh HOME and
fake credentials, and writes ``NAME.stdout.jsonl``, ``NAME.stderr.txt`` and
``NAME.json``. The two sets live in tests/fixtures/: ``reference`` (the transcripts the
outcome table was designed from; its hand-written README is kept) and ``captured``
(the scenarios this repo added; its README is generated here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.capture_codex_gemini import SETS as OTHER_SETS
from tests.support.capture_codex_gemini import capture_set
from tests.support.messages_api import MessagesApiStandIn, real_cli_path

VERSION = "2.1.328"
UNKNOWN_SESSION_ID = "3f0b6a2e-1111-4222-8333-944445555666"


@dataclass(frozen=True)
class Capture:
    """One scenario: the extra env (fake credentials only), extra argv, and what it shows."""

    name: str
    shows: str
    env: dict[str, str]
    args: tuple[str, ...] = ()
    sandbox: bool = True  # False: drop IS_SANDBOX, to see the root refusal


REFERENCE = (
    Capture(
        "success_oauth",
        "subscription OAuth token served the turn",
        {"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-good-aaaa"},
    ),
    Capture(
        "success_api_key",
        "API key served the turn (apiKeySource=ANTHROPIC_API_KEY)",
        {"ANTHROPIC_API_KEY": "sk-ant-api03-good-bbbb"},
    ),
    Capture(
        "shadow_api_key_beats_oauth",
        "both set: the API key wins, the OAuth token is silently unused",
        {
            "CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-good-aaaa",
            "ANTHROPIC_API_KEY": "sk-ant-api03-good-cccc",
        },
    ),
    Capture(
        "rate_limit_five_hour_oauth",
        "subscription 5-hour window exhausted",
        {"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-ratelimit-dddd"},
    ),
    Capture(
        "auth_oauth_401",
        "OAuth token rejected by the API (401)",
        {"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-badauth-eeee", "CLAUDE_CODE_MAX_RETRIES": "1"},
    ),
    Capture(
        "billing_credit_low_api_key",
        "API key with no credit",
        {"ANTHROPIC_API_KEY": "sk-ant-api03-nocredit-ffff"},
    ),
    Capture(
        "model_not_found",
        "model id the API does not know (404)",
        {"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-good-aaaa"},
        ("--model", "claude-nonexistent-9"),
    ),
    Capture("not_logged_in", "no credential at all", {}),
)
"""The scenarios of tests/fixtures/claude-code-2.1.328 (the reference set)."""

CAPTURED = (
    Capture(
        "rate_limit_seven_day_oauth",
        "subscription weekly window exhausted: rate_limit_event rateLimitType seven_day + "
        "resetsAt; api_error usage_limit_reached; `You've hit your weekly limit · resets …`",
        {"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-weekly-xxxx"},
    ),
    Capture(
        "rate_limit_api_key",
        "API key over its request limit: error rate_limit, api_error_status 429, but NO "
        "rate_limit_event and no reset instant",
        {"ANTHROPIC_API_KEY": "sk-ant-api03-ratelimit-xxxx", "CLAUDE_CODE_MAX_RETRIES": "0"},
    ),
    Capture(
        "auth_api_key_401",
        "API key rejected (401): error authentication_failed, one api_retry first, "
        "`Invalid API key · Fix external API key`",
        {"ANTHROPIC_API_KEY": "sk-ant-api03-badauth-xxxx", "CLAUDE_CODE_MAX_RETRIES": "1"},
    ),
    Capture(
        "overloaded_529",
        "API overloaded (529): an api_retry event, then error server_error, api_error_status 529",
        {"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-overloaded-xxxx", "CLAUDE_CODE_MAX_RETRIES": "1"},
    ),
    Capture(
        "server_error_500",
        "API internal error (500), no retry: error server_error, api_error_status 500",
        {
            "CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-servererror-xxxx",
            "CLAUDE_CODE_MAX_RETRIES": "0",
        },
    ),
    Capture(
        "not_logged_in",
        "no credential at all: authentication_failed, api_error_status null, no request sent",
        {},
    ),
    Capture(
        "unknown_session_resume",
        "--resume <unknown uuid>: no init and no API call; one result subtype "
        "error_during_execution, errors [`No conversation found with session ID: <id>`], "
        "the same line on stderr",
        {"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-good-xxxx"},
        ("--resume", UNKNOWN_SESSION_ID),
    ),
    Capture(
        "success_auth_token_gateway",
        "ANTHROPIC_AUTH_TOKEN (a gateway token) is sent as Authorization: Bearer; "
        "apiKeySource none",
        {"ANTHROPIC_AUTH_TOKEN": "gw-token-good-xxxx"},
    ),
    Capture(
        "root_refusal_bypass",
        "as root without IS_SANDBOX, bypassPermissions is refused: empty stdout, one stderr line",
        {"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-good-xxxx"},
        ("--permission-mode", "bypassPermissions"),
        sandbox=False,
    ),
)
"""The scenarios of tests/fixtures/claude-code-2.1.328-captured."""

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SETS = {
    "reference": (REFERENCE, FIXTURES / "claude-code-2.1.328", False),
    "captured": (CAPTURED, FIXTURES / "claude-code-2.1.328-captured", True),
}
"""Set name -> (scenarios, default folder, whether its README is generated)."""


def capture(cli: Path, api: MessagesApiStandIn, spec: Capture, outdir: Path) -> dict[str, object]:
    """Run one scenario and write its three files; return its metadata."""
    argv = ["claude", "-p", "hi", "--output-format", "stream-json", "--verbose", *spec.args]
    with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as work:
        env = api.cli_env(Path(home), **spec.env)
        if not spec.sandbox:
            env.pop("IS_SANDBOX", None)
        done = subprocess.run(
            [str(cli), *argv[1:]],
            env=env,
            cwd=work,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
            check=False,
        )
    (outdir / f"{spec.name}.stdout.jsonl").write_bytes(done.stdout)
    (outdir / f"{spec.name}.stderr.txt").write_bytes(done.stderr)
    meta: dict[str, object] = {
        "scenario": spec.name,
        "shows": spec.shows,
        "exit_code": done.returncode,
        "argv": argv,
        "env": spec.env,
        "env_names": sorted(env),
        "claude_code_version": VERSION,
        "api": "tests/support/messages_api.py, the loopback stand-in for the Messages API; "
        "its replies mirror the real API's error bodies and rate-limit headers",
    }
    (outdir / f"{spec.name}.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


README_HEAD = """\
# Real Claude Code transcripts (CLI 2.1.328), captured by this repo

Written by `python -m tests.support.capture_fixtures` (do not edit by hand): the real
`claude` binary run as `claude -p hi --output-format stream-json --verbose [args]`
against `tests/support/messages_api.py` (the loopback Messages API stand-in), with a
fresh HOME and fake credentials. Same three files a scenario as the reference set in
tests/fixtures/claude-code-2.1.328: `NAME.stdout.jsonl`, `NAME.stderr.txt`,
`NAME.json` (exit code, argv, the fake credentials given, the names of all env vars).
Reset instants, session ids and the stand-in's port differ between captures.

| scenario | exit | shows |
| --- | --- | --- |
"""


def write_readme(outdir: Path, metas: list[dict[str, object]]) -> None:
    """Write the folder's README.md: one table row a scenario."""
    rows = "".join(f"| {m['scenario']} | {m['exit_code']} | {m['shows']} |\n" for m in metas)
    (outdir / "README.md").write_text(README_HEAD + rows)


def main(argv: list[str] | None = None) -> int:
    """Record every scenario of the named set into its folder (or the one given)."""
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2 or args[0] not in (*SETS, *OTHER_SETS):
        sys.stderr.write(
            "usage: python -m tests.support.capture_fixtures "
            "reference|captured|codex|gemini [OUTDIR]\n"
        )
        return 2
    if args[0] in OTHER_SETS:
        folder = capture_set(args[0], Path(args[1]) if len(args) == 2 else None)
        sys.stdout.write(f"recorded {folder}\n")
        return 0
    scenarios, default_dir, generated_readme = SETS[args[0]]
    cli = real_cli_path()
    if cli is None or not cli.exists():
        sys.stderr.write("the real CLI is missing: set AGENT_SERVER_TEST_CLAUDE_BIN\n")
        return 2
    outdir = Path(args[1]) if len(args) == 2 else default_dir
    outdir.mkdir(parents=True, exist_ok=True)
    metas = []
    with MessagesApiStandIn() as api:
        for spec in scenarios:
            if not spec.sandbox and os.geteuid() != 0:
                continue  # the refusal only happens as root
            metas.append(capture(cli, api, spec, outdir))
            sys.stdout.write(f"{spec.name}: exit {metas[-1]['exit_code']}\n")
    if generated_readme:
        write_readme(outdir, metas)
    return 0


if __name__ == "__main__":
    sys.exit(main())

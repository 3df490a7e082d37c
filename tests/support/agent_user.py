"""The agent as another user: the test spawn user, and what it must reach to run.

A turn's CLI runs as `AGENT_SERVER_SPAWN_USER`, which cannot enter a checkout that
lives under a private directory (a 0700 home, a `mktemp -d` folder): nothing it runs
may be found there. So the session copies what a spawn runs into a directory everyone
may traverse (`Reachable`): the stand-in CLIs (stdlib only) behind an interpreter
that user can run, the real Claude Code CLI (hardlinked when it can be), and for a
server that itself runs as another user, this package and its dependencies.

Creating a user needs root, which CI has; elsewhere these tiers skip (and fail under
CI: `tests.conftest.unavailable`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from agent_server.process.spawn_user import REQUIRED_CAPABILITIES
from tests.conftest import unavailable

REPO = Path(__file__).resolve().parents[2]
SPAWN_TEST_USER = "agent-server-spawn"
SERVER_CAPABILITIES = f"{sum(1 << bit for bit in REQUIRED_CAPABILITIES.values()):016x}"
"""A capability set as /proc/<pid>/status shows it: exactly what a server that is not
root keeps to run turns as the spawn user (the image's agent-server, startup.sh)."""
STAND_INS = ("fake-claude", "hostile-cli", "intruder-cli", "fake-codex", "fake-gemini")
_SUPPORT_MODULES = ("fake_cli", "fake_claude", "hostile_cli", "intruder_cli", "fake_codex",
                    "fake_gemini")  # fmt: skip


def spawn_test_user() -> pwd.struct_passwd:
    """The spawn user of these tests, created (once per machine) when missing."""
    if os.geteuid() != 0:
        unavailable("the spawn-user tier creates a user and switches to it: run it as root")
    try:
        return pwd.getpwnam(SPAWN_TEST_USER)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    subprocess.run(
        [useradd, "--system", "--create-home", "--home-dir", f"/home/{SPAWN_TEST_USER}",
         "--shell", "/usr/sbin/nologin", SPAWN_TEST_USER],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return pwd.getpwnam(SPAWN_TEST_USER)


def runs_as(uid: int, command: list[str]) -> bool:
    """True when `command` runs to a zero exit as `uid`."""
    try:
        done = subprocess.run(
            command, user=uid, capture_output=True, timeout=60, check=False, cwd="/"
        )
    except OSError:
        return False
    return done.returncode == 0


class Reachable:
    """A directory every user may traverse, holding what another user must run."""

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.root = Path(tempfile.mkdtemp(prefix="agent-server-reach-"))
        self.root.chmod(0o755)
        self.python = self._python()
        tests = self.root / "tests"
        (tests / "support").mkdir(parents=True)
        (tests / "__init__.py").touch()
        (tests / "support" / "__init__.py").touch()
        for module in _SUPPORT_MODULES:
            shutil.copy(REPO / "tests" / "support" / f"{module}.py", tests / "support")
        shutil.copytree(REPO / "tests" / "fixtures", tests / "fixtures")
        for name in STAND_INS:
            script = (REPO / "tests" / "support" / name).read_text().split("\n", 1)[1]
            (tests / "support" / name).write_text(f"#!{self.python}\n{script}")
            (tests / "support" / name).chmod(0o755)

    def stand_in(self, name: str) -> Path:
        """A stand-in CLI (`fake-claude`, `intruder-cli`, …) the other user can run."""
        return self.root / "tests" / "support" / name

    def program(self, path: Path) -> Path:
        """A copy of the executable `path` (hardlinked where it can be: the real CLI is
        373 MB) the other user can run."""
        target = self.root / "bin" / path.name
        target.parent.mkdir(exist_ok=True)
        if not target.exists():
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)
        return target

    def server(self) -> tuple[list[str], dict[str, str]]:
        """How the other user runs `agent-server serve` itself: argv and the environment
        to add (this package and the venv's packages, copied here)."""
        site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
        packages = self.root / "site-packages"
        if not packages.exists():
            _tree(site, packages)
            _tree(REPO / "agent_server", self.root / "src" / "agent_server")
        argv = [self.python, "-m", "agent_server", "serve"]
        return argv, {"PYTHONPATH": f"{self.root / 'src'}:{packages}"}

    def spawn_environ(self, command: Path) -> dict[str, str]:
        """What a server (as root) adds to run its turns' `command` (a copy here) as this
        user, in a workdir of that user's own with the agent's `.env` in it."""
        work = self.directory("work")
        return {
            "AGENT_SERVER_SPAWN_USER": pwd.getpwuid(self.uid).pw_name,
            "AGENT_SERVER_RUNTIME_COMMAND": str(command),
            "AGENT_SERVER_WORKDIR": str(work),
            "AGENT_SERVER_ENV_FILE": str(work / ".env"),
        }

    def directory(self, name: str) -> Path:
        """A fresh directory here that the other user owns (a workdir, a home)."""
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))
        os.chown(path, self.uid, self.uid)
        return path

    def close(self) -> None:
        """Remove everything copied here."""
        shutil.rmtree(self.root, ignore_errors=True)

    def _python(self) -> str:
        """An interpreter of this Python's version the other user can run: this one when
        it lives where everyone may go, else the system's."""
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        probe = f"import sys; assert sys.version_info[:2] == {sys.version_info[:2]!r}"
        candidates = (os.path.realpath(sys.executable), f"/usr/bin/{version}", "/usr/bin/python3")
        for candidate in candidates:
            if runs_as(self.uid, [candidate, "-I", "-c", probe]):
                return candidate
        unavailable(f"no {version} that uid {self.uid} can run (install python3 from Debian)")


def _tree(source: Path, target: Path) -> None:
    """`source` copied to `target`, hardlinked where the file system allows."""
    try:
        shutil.copytree(source, target, copy_function=os.link, ignore=_pycache)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, ignore=_pycache)


def _pycache(_: str, names: list[str]) -> list[str]:
    return [name for name in names if name == "__pycache__"]

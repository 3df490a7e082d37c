"""The README stays true to the tree: every module is named in "Where things live", every
name there exists, and the Makefile's targets are the ones `make help` and the README name."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "agent_server"
_FOLDER = re.compile(r"^( +)([a-z_]+)/ ")
_MODULE = re.compile(r"\b([a-z_]+\.py)\b")


def _layout() -> list[str]:
    """The indented block under "## Where things live"."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("    ")]


def named_modules() -> set[str]:
    """Every `folder/module.py` the block names: the package's lines are indented under
    `agent_server/`; a folder's modules are on its line or the lines indented under it
    (a subfolder's likewise, one level deeper), the package's own modules at the top level."""
    named: set[str] = set()
    folder = sub = ""
    for line in _layout()[1:]:  # the first line is `agent_server/`
        indent = len(line) - len(line.lstrip())
        if indent <= 4:
            break  # tests/, bench/, …: past the package
        found = _FOLDER.match(line)
        if indent == 6:
            folder, sub = (found.group(2) if found else ""), ""
        elif indent == 8:  # a folder's own subfolder (controller/pool/), or one of its modules
            sub = found.group(2) if found else ""
        prefix = "".join(f"{part}/" for part in (folder, sub) if part)
        named.update(prefix + module for module in _MODULE.findall(line))
    return named


def tree_modules() -> set[str]:
    """Every module of the package but `__init__.py` files."""
    return {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }


def test_every_module_is_named_in_where_things_live() -> None:
    """A new module must be placed in the README's map: nothing hides from a newcomer."""
    missing = tree_modules() - named_modules()
    assert not missing, f"not in README's 'Where things live': {sorted(missing)}"


def test_every_module_named_there_exists() -> None:
    """A module that moved or went must leave the map too."""
    gone = named_modules() - tree_modules()
    assert not gone, f"named in README's 'Where things live' but not in the tree: {sorted(gone)}"


def test_make_help_lists_every_target_the_readme_names() -> None:
    """Each `make X` of the README is a target with a `##` line (what `make help` prints)."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    helped = set(re.findall(r"^([a-z-]+):.*## ", makefile, flags=re.MULTILINE))
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`make ([a-z-]+)", readme))
    assert named <= helped, sorted(named - helped)
    assert {"help", "run", "test", "bench", "conformance", "image"} <= helped

"""The front door: `agent_server.controller` exports its public API, and only it."""

from __future__ import annotations

import ast
import tomllib
import types
from pathlib import Path

import agent_server
import agent_server.controller as controller

REPO = Path(__file__).resolve().parents[3]


def test_all_names_every_public_member() -> None:
    """As httpx's test does: `__all__` is exactly the package's public names, sorted."""
    public = [
        name
        for name, value in vars(controller).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    ]
    assert controller.__all__ == sorted(public)


def test_every_exported_name_is_the_controllers_own() -> None:
    """Nothing of the server leaks through the front door (only the library's names)."""
    for name in controller.__all__:
        value = getattr(controller, name)
        if isinstance(value, type | types.FunctionType):  # aliases name typing's types
            assert value.__module__.startswith("agent_server.controller."), name


def _python_blocks() -> list[str]:
    text = (REPO / "docs" / "controller.md").read_text(encoding="utf-8")
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


def test_the_docs_import_only_from_the_front_door() -> None:
    """The guide's examples import the library from `agent_server.controller` alone."""
    modules = {
        node.module
        for block in _python_blocks()
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "agent_server.controller" in modules
    assert not {m for m in modules if m.startswith("agent_server")} - {"agent_server.controller"}


def test_the_docs_example_imports_run() -> None:
    """Every import of the guide's examples runs: no name the library lacks."""
    for block in _python_blocks():
        compile(block, "controller.md", "exec")  # the whole example is Python
        imports = [n for n in ast.parse(block).body if isinstance(n, ast.Import | ast.ImportFrom)]
        exec(compile(ast.Module(imports, []), "controller.md", "exec"), {})  # noqa: S102


def test_the_package_ships_its_type_marker() -> None:
    """PEP 561: `py.typed` is in the package and in its package data, so a wheel is typed."""
    assert (Path(agent_server.__file__).parent / "py.typed").is_file()
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["agent_server"]

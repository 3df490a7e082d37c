"""The package reads top-down: imports only point down the layers, and functions stay small.

    __main__ > app > services          the composition root: builds and wires
      routes, auth, openapi,           HTTP in and out
      client_limits
        config                         settings (names the runtimes)
          execution | readiness        one turn: accept, run, detach, answer; /health's problems
            outcome                    classification: the contract's table, pure
              runtimes | credentials   each owns its facts
              | records | broker       what outlives a turn; the API's side of a turn
                spawn_env              the environment of a spawn
                  process | logs       a process's lifecycle, knowing nothing of turns
                    leaves             errors, redaction, metrics > wire, secret_file

A module may import its own folder and anything on a lower layer; two folders on
the same layer (runtimes, credentials, records, broker) never import each other.

One idea a module, named by the module; no cap on a module's length (a cap splits
by size, not by idea), but a function past FUNCTION_BUDGET lines of code (docstring,
comments and blank lines not counted) is doing two jobs.

Each CLI's facts live on its adapter (`runtimes/`): the outcome table is handed them
(`OutcomeHints`) and spells no CLI's name, marker or wording itself; no module outside
`runtimes/` spells an adapter's marker.

The controller library sits beside the server: it may import only the wire leaf
(`wire/`: models, names, signing, fixed messages, instants), and nothing of the
server imports it but `__main__`, the command line's composition root (`agent-server
pool …`). Only its Redis store imports `redis`, the optional dependency.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from agent_server.runtimes import ADAPTERS

PACKAGE = Path(__file__).resolve().parents[2] / "agent_server"
FUNCTION_BUDGET = 60

LAYERS: dict[str, int] = {
    "__main__": 12,
    "app": 11,
    "services": 10,
    "routes": 9,
    "auth": 9,
    "openapi": 9,
    "client_limits": 9,
    "config": 8,
    "execution": 7,
    "readiness": 7,
    "outcome": 6,
    "runtimes": 5,
    "records": 5,
    "credentials": 5,
    "broker": 5,
    "spawn_env": 4,
    "process": 3,
    "logs": 3,
    "controller": 3,
    "errors": 2,
    "redaction": 2,
    "metrics": 2,
    "wire": 0,
    "secret_file": 0,
    "__init__": 0,
}


def _unit(module: str) -> str:
    """The layer unit of a dotted module under agent_server: its folder, or itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_layers_reject_an_upward_import() -> None:
    """The check itself: an execution module importing a route would be caught."""
    assert (
        LAYERS[_unit("agent_server.routes.health")] > LAYERS[_unit("agent_server.execution.turn")]
    )


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every agent_server module `path` imports (also inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "agent_server":
                # `from agent_server import app` is a module; `__version__` is the package's.
                found.update(
                    f"agent_server.{alias.name}"
                    if (PACKAGE / f"{alias.name}.py").exists() or (PACKAGE / alias.name).is_dir()
                    else "agent_server.__init__"
                    for alias in node.names
                )
            elif node.module.startswith("agent_server."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("agent_server."))
    return found


def _dotted(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(relative.parts)


def test_every_unit_has_a_layer() -> None:
    """A new folder or top-level module must be placed on a layer here first."""
    units = {_unit(_dotted(path)) for path in _modules()}
    assert units <= set(LAYERS), units - set(LAYERS)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    """Each import stays in its own folder or goes to a strictly lower layer."""
    mine = _unit(_dotted(path))
    upward = [
        target
        for target in _imports(path)
        if (unit := _unit(target)) != mine
        and unit != "__init__"
        and LAYERS.get(unit, 99) >= LAYERS[mine]
    ]
    assert not upward, f"{path.relative_to(PACKAGE)} reaches up or sideways to {upward}"


def _code_lines(function: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """Lines of `function` that hold code: not its docstring, a comment or a blank."""
    first = function.body[0]
    docstring = (
        range(first.lineno, (first.end_lineno or first.lineno) + 1)
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        else range(0)
    )
    return sum(
        1
        for number in range(function.lineno, (function.end_lineno or function.lineno) + 1)
        if number not in docstring
        and (text := lines[number - 1].strip())
        and not text.startswith("#")
    )


def _long_functions(source: str, budget: int) -> list[str]:
    lines = source.splitlines()
    return [
        f"{node.name}: {count} lines"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (count := _code_lines(node, lines)) > budget
    ]


def test_the_budget_counts_code_only() -> None:
    """The check itself: a docstring and comments are free, a long body is caught."""
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    long = f'def f():\n    """Doc\n\n    more."""\n    # note\n\n{body}\n'
    assert _long_functions(long, FUNCTION_BUDGET) == ["f: 61 lines"]
    assert _long_functions(long.replace("    x59 = 59\n", ""), FUNCTION_BUDGET) == []


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_over_budget(path: Path) -> None:
    """One job a function: past FUNCTION_BUDGET lines of code it is doing two."""
    assert not _long_functions(path.read_text(encoding="utf-8"), FUNCTION_BUDGET)


CONTROLLER_MAY_IMPORT = frozenset({"controller", "wire"})
CONTROLLER_IMPORTED_BY = frozenset({"__main__", "controller"})
REDIS_ONLY_IN = PACKAGE / "controller" / "stores" / "redis.py"


def _third_party(path: Path) -> set[str]:
    """The top-level names of every non-agent_server module `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
    return found - {"agent_server"}


def test_the_controller_check_catches_a_server_import() -> None:
    """The check itself: a controller module importing the runner would be caught."""
    assert _unit("agent_server.process.runner") not in CONTROLLER_MAY_IMPORT


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_controller_and_the_server_meet_only_at_the_wire(path: Path) -> None:
    """The controller imports only the wire leaf; only __main__ imports it."""
    mine = _unit(_dotted(path))
    units = {_unit(target) for target in _imports(path)}
    if mine == "controller":
        assert units <= CONTROLLER_MAY_IMPORT, units - CONTROLLER_MAY_IMPORT
    elif "controller" in units:
        assert mine in CONTROLLER_IMPORTED_BY, f"{mine} imports the controller"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_redis_store_imports_redis(path: Path) -> None:
    """redis is the controller extra's: a server without it must still import everything."""
    assert ("redis" in _third_party(path)) is (path == REDIS_ONLY_IN)


CLI_NAMES = re.compile(r"claude|codex|gemini|anthropic|openai|google", re.IGNORECASE)
"""The CLIs and their vendors: names the outcome table never spells."""
OUTCOME = PACKAGE / "outcome"
RUNTIMES = PACKAGE / "runtimes"
OUTCOME_PATTERNS_ALLOWED = {"evidence.py": 1}
"""Literal regexes outcome/ may compile: the shell's and kernel's words for a kill."""
_RE_CALLS = frozenset({"compile", "search", "match", "fullmatch", "findall", "finditer", "sub"})


def _spelt(source: str) -> list[str]:
    """Every string a module spells: its literals (docstrings too, implicit
    concatenations joined) and its comments."""
    literals = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return literals + [token.string for token in tokens if token.type == tokenize.COMMENT]


def _literal_patterns(source: str) -> list[str]:
    """The string literals a module hands `re` as a pattern."""
    return [
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "re"
        and node.func.attr in _RE_CALLS
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ]


def _runtime_markers() -> set[str]:
    """Every marker and text pattern an adapter hands the outcome table, lower case."""
    markers: set[str] = set()
    for adapter in ADAPTERS:
        hints = adapter.hints
        markers.update(marker for marker, _ in hints.error_markers)
        markers.update(hints.permission_refusals)
        markers.update(hints.model_rejection_markers)
        markers.update(hints.unknown_session_markers)
        markers.update(pattern.pattern for pattern, _ in hints.text_markers)
    return {marker.lower() for marker in markers}


def test_the_facts_checks_catch_a_cli_spelt_in_outcome() -> None:
    """The checks themselves: a name in a docstring, a marker in a comment, a regex."""
    source = (
        '"""Reads Codex\'s words."""\n'
        "import re\n"
        "# [claude-code:unrecognized_model] is a rejection\n"
        'WORDING = re.compile(r"try again at " "[0-9]+")\n'
    )
    spelt = _spelt(source)
    assert any(CLI_NAMES.search(text) for text in spelt)
    assert any("[claude-code:unrecognized_model]" in text.lower() for text in spelt)
    assert _literal_patterns(source) == ["try again at [0-9]+"]
    assert "[claude-code:unrecognized_model]" in _runtime_markers()


@pytest.mark.parametrize("path", sorted(OUTCOME.rglob("*.py")), ids=lambda p: p.name)
def test_the_outcome_table_spells_no_cli(path: Path) -> None:
    """outcome/ names no CLI and compiles no CLI's wording: each adapter hands its own."""
    source = path.read_text(encoding="utf-8")
    named = [text for text in _spelt(source) if CLI_NAMES.search(text)]
    assert not named, named
    patterns = _literal_patterns(source)
    assert len(patterns) <= OUTCOME_PATTERNS_ALLOWED.get(path.name, 0), patterns


@pytest.mark.parametrize(
    "path",
    [path for path in _modules() if RUNTIMES not in path.parents],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_a_runtime_marker_is_spelt_only_in_runtimes(path: Path) -> None:
    """No module outside runtimes/ spells a marker an adapter owns."""
    spelt = [text.lower() for text in _spelt(path.read_text(encoding="utf-8"))]
    found = sorted(marker for marker in _runtime_markers() if any(marker in t for t in spelt))
    assert not found, found

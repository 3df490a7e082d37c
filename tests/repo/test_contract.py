"""Every error the server can answer is mapped, documented, and in /openapi.json.

Like httpx's test that every lower-level exception is mapped: each `ApiError`
subclass and each outcome kind has one status and error_code, appears in the
OpenAPI enums, and stands in docs/contract.md; and the contract's routes and error
codes are exactly the OpenAPI document's, whichever side would drift.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agent_server.app import ENDPOINTS, ERROR_CODES_BY_MODEL, create_app
from agent_server.config import Settings
from agent_server.errors import ApiError, api_error_codes
from agent_server.openapi import openapi_document
from agent_server.outcome.classify import ERROR_CODES, ROWS, STATUS_BY_ERROR_CODE
from agent_server.wire.names import OutcomeKind

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "contract.md"
_ROUTE_ROW = re.compile(r"^\| `(GET|POST|PUT|PATCH|DELETE) (/\S*)` \|", re.MULTILINE)
_CODE_ROW = re.compile(r"^\| `([a-z_]+)` \| (\d{3}|other) \|", re.MULTILINE)


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    """The OpenAPI document the app serves."""
    return openapi_document(
        ENDPOINTS, title="agent-server", version="test", error_codes=ERROR_CODES_BY_MODEL
    )


def _section(title: str) -> str:
    """The text of the contract's section headed `title`, up to the next heading of its level."""
    text = CONTRACT.read_text(encoding="utf-8")
    match = re.search(rf"^(#+) {re.escape(title)}\n", text, re.MULTILINE)
    assert match is not None, f"docs/contract.md has no section {title!r}"
    level = match.group(1)
    rest = text[match.end() :]
    end = re.search(rf"^{level} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def _openapi_codes(document: dict[str, Any]) -> set[str]:
    codes: set[str] = set()
    for schema in document["components"]["schemas"].values():
        codes.update(schema.get("properties", {}).get("error_code", {}).get("enum", []))
    return codes


def test_every_route_is_in_both() -> None:
    """The routes table of §5 lists exactly the operations of the OpenAPI document."""
    documented = set(_ROUTE_ROW.findall(_section("5. Routes")))
    served = {(e.method, e.path) for e in ENDPOINTS}
    assert documented == served


def test_every_error_code_is_in_both(document: dict[str, Any]) -> None:
    """The error-code table of §5.2 lists exactly the codes the OpenAPI enums allow."""
    documented = {code for code, _ in _CODE_ROW.findall(_section("5.2 Error codes"))}
    assert documented == _openapi_codes(document)


def test_every_outcome_code_is_documented_with_its_status() -> None:
    """Each turn error_code stands in §5.2 with the status its outcome answers."""
    rows = dict(_CODE_ROW.findall(_section("5.2 Error codes")))
    for code, status in STATUS_BY_ERROR_CODE.items():
        assert rows[code] == str(status), code


def test_every_api_error_is_documented_with_its_status() -> None:
    """Each ApiError subclass stands in §5.2 with its own status."""
    rows = dict(_CODE_ROW.findall(_section("5.2 Error codes")))
    pending: list[type[ApiError]] = [ApiError]
    while pending:
        cls = pending.pop()
        assert rows[cls.error_code] == str(cls.status), cls.__name__
        pending.extend(cls.__subclasses__())


def _api_errors() -> list[type[ApiError]]:
    found: list[type[ApiError]] = []
    pending: list[type[ApiError]] = [ApiError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_outcome_kind_has_a_row() -> None:
    """The table answers every kind; every failing kind has its own error_code."""
    assert set(ROWS) == set(OutcomeKind)
    failing = [row.error_code for kind, row in ROWS.items() if row.status >= 400]
    assert len(failing) == len(set(failing)) == len(ERROR_CODES)


def test_every_api_error_has_its_own_code_in_the_enum() -> None:
    """No two ApiError classes share a code; each is in the OpenAPI enum of error bodies."""
    codes = [cls.error_code for cls in _api_errors()]
    assert len(codes) == len(set(codes))
    assert set(codes) <= set(api_error_codes())
    assert not set(api_error_codes()) & set(ERROR_CODES)


def test_the_app_maps_every_api_error_in_one_place(environ: dict[str, str]) -> None:
    """Each ApiError subclass reaches the one ApiError handler (nothing is caught apart)."""
    app = create_app(Settings.from_environ({**environ, "AGENT_SERVER_INSECURE_NO_AUTH": "1"}))
    handlers = app.exception_handlers
    for cls in _api_errors():
        mapped = next(handlers[base] for base in cls.__mro__ if base in handlers)
        assert mapped is handlers[ApiError], cls.__name__


def test_the_contract_cites_nothing_outside_the_repository() -> None:
    """No link or path in the contract leaves the repository."""
    text = CONTRACT.read_text(encoding="utf-8")
    assert "../" not in text

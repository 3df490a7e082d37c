"""docs/contract.md and /openapi.json name the same routes and the same error codes.

The OpenAPI document is generated from the code; the contract is prose. This test
keeps the two from drifting: a route or an error code in one and not in the other
fails, whichever side it is missing from.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agent_server.app import ENDPOINTS, ERROR_CODES_BY_MODEL
from agent_server.errors import ApiError
from agent_server.execution.outcome import STATUS_BY_ERROR_CODE
from agent_server.openapi import openapi_document

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


def test_the_contract_cites_nothing_outside_the_repository() -> None:
    """No link or path in the contract leaves the repository."""
    text = CONTRACT.read_text(encoding="utf-8")
    assert "../" not in text

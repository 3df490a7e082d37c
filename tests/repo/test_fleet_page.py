"""agent_server/controller/service/page.html: one self-contained file that never parses data
as HTML and never puts the token in a URL (its behaviour is tested in a real browser:
tests/e2e/controller/test_page.py)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "agent_server" / "controller" / "service" / "page.html"


class Elements(HTMLParser):
    """Every start tag with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


@pytest.fixture(scope="module")
def text() -> str:
    """The page's source."""
    return PAGE.read_text(encoding="utf-8")


def test_nothing_is_loaded_from_elsewhere(text: str) -> None:
    """No external script, stylesheet, font, image or frame: no build step, no CDN."""
    parser = Elements()
    parser.feed(text)
    for tag, attrs in parser.tags:
        assert tag not in ("link", "iframe", "object", "embed", "img"), tag
        assert "src" not in attrs, (tag, attrs)
    assert not re.search(r"@import|url\(|https?://", text, re.IGNORECASE)


@pytest.mark.parametrize(
    "sink",
    ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"],
)
def test_no_data_is_ever_parsed_as_html_or_code(text: str, sink: str) -> None:
    """Values reach the page as text nodes and attributes only."""
    assert sink not in text


def test_the_token_travels_in_a_header_only(text: str) -> None:
    """No EventSource (it cannot send a header), no token in a query string; the token
    lives in sessionStorage, not localStorage."""
    assert "EventSource" not in text
    assert "localStorage" not in text
    assert re.search(r"Authorization: \"Bearer \" \+ token\(\)", text)
    assert not re.search(r"[?&](token|access_token|bearer)=", text, re.IGNORECASE)

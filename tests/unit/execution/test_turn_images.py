"""Images with a turn (contract §6.1): validated, and handed to Claude Code on stdin as
image blocks of one stream-json user message; a runtime that cannot take them refuses.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest

from agent_server.runtimes.base import TurnSpec
from agent_server.runtimes.claude_code import ClaudeCodeAdapter
from agent_server.services import Services
from agent_server.wire.turns import MAX_IMAGE_BYTES, MAX_IMAGES, MAX_IMAGES_BYTES
from tests.support.images import ONE_IMAGE, data_fingerprint, image, png
from tests.support.in_process import cli_report, fake_cli_services, request

pytestmark = pytest.mark.timeout(60)

BLUE = image(png(0, 0, 255), "image/png")


def _post(services: Services, path: str, body: dict[str, Any]) -> httpx.Response:
    return request(services, "POST", path, json=body)


@pytest.fixture
def services(environ: dict[str, str]) -> Services:
    return fake_cli_services(environ, CLAUDE_CODE_OAUTH_TOKEN="unit-baseline-oauth-0123456789")


def test_the_adapter_writes_one_user_message_with_the_images_first() -> None:
    """stdin is one JSON line: an image block per image, in order, then the prompt's text."""
    turn = TurnSpec(
        prompt="what colour?",
        permission_mode="default",
        images=(("image/png", "AAAA"), ("image/webp", "BBBB")),
    )
    adapter = ClaudeCodeAdapter()
    assert adapter.argv("claude", turn)[-2:] == ["--input-format", "stream-json"]
    line = adapter.stdin(turn)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    blocks = [
        {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
        for media, data in turn.images
    ]
    assert json.loads(line) == {
        "type": "user",
        "message": {"role": "user", "content": [*blocks, {"type": "text", "text": "what colour?"}]},
    }


def test_without_images_the_prompt_is_plain_stdin() -> None:
    """No image: no input-format flag, and stdin is the prompt itself."""
    turn = TurnSpec(prompt="hi", permission_mode="default")
    adapter = ClaudeCodeAdapter()
    assert "--input-format" not in adapter.argv("claude", turn)
    assert adapter.stdin(turn) == b"hi"


@pytest.mark.parametrize("path", ["/api/task", "/api/chat"])
def test_images_reach_the_cli_with_the_prompt(services: Services, path: str) -> None:
    """Both routes: the CLI reads the prompt and each image, by type and exact bytes."""
    body = {"message": "@sleep 0\ndescribe", "images": [ONE_IMAGE, BLUE]}
    report = cli_report(_post(services, path, body))
    assert report["prompt"] == "@sleep 0\ndescribe"
    assert report["images"] == [
        {"media_type": "image/png", "fp": data_fingerprint(ONE_IMAGE)},
        {"media_type": "image/png", "fp": data_fingerprint(BLUE)},
    ]
    assert report["argv"][-2:] == ["--input-format", "stream-json"]


def _of_size(decoded: int) -> dict[str, Any]:
    return {"media_type": "image/jpeg", "data": base64.b64encode(b"\xff" * decoded).decode()}


@pytest.mark.parametrize(
    ("images", "loc"),
    [
        pytest.param([], ["body", "images"], id="an empty list"),
        pytest.param([ONE_IMAGE] * (MAX_IMAGES + 1), ["body", "images"], id="one too many"),
        pytest.param(
            [{**ONE_IMAGE, "media_type": "image/svg+xml"}],
            ["body", "images", 0, "media_type"],
            id="a media type the model cannot read",
        ),
        pytest.param(
            [{**ONE_IMAGE, "data": "not base64!"}],
            ["body", "images", 0, "data"],
            id="data that is not base64",
        ),
        pytest.param([{**ONE_IMAGE, "data": ""}], ["body", "images", 0, "data"], id="empty data"),
        pytest.param(
            [{"media_type": "image/png"}], ["body", "images", 0, "data"], id="no data at all"
        ),
        pytest.param([{**ONE_IMAGE, "extra": 1}], ["body", "images", 0], id="an unknown field"),
        pytest.param(
            [_of_size(MAX_IMAGE_BYTES + 1)],
            ["body", "images", 0, "data"],
            id="one image over its limit",
        ),
        pytest.param(
            [*[_of_size(MAX_IMAGE_BYTES)] * (MAX_IMAGES_BYTES // MAX_IMAGE_BYTES), _of_size(1)],
            ["body"],
            id="images over the turn's total",
        ),
    ],
)
def test_a_bad_image_is_a_422_and_nothing_runs(
    services: Services, images: list[dict[str, Any]], loc: list[str | int]
) -> None:
    """Each limit answers 422 at the offending field, the data never echoed."""
    response = _post(services, "/api/task", {"message": "x", "images": images})
    assert response.status_code == 422, response.text
    assert [issue["loc"] for issue in response.json()["detail"]] == [loc]
    assert "input" not in response.text
    assert services.registry.recently_completed() == []


def test_images_at_every_limit_are_taken(services: Services) -> None:
    """Ten images, the largest one at its limit and the total at the turn's: served."""
    largest = _of_size(MAX_IMAGE_BYTES)
    rest = (MAX_IMAGES_BYTES - MAX_IMAGE_BYTES) // (MAX_IMAGES - 1)
    images = [largest, *[_of_size(rest)] * (MAX_IMAGES - 1)]
    report = cli_report(_post(services, "/api/task", {"message": "x", "images": images}))
    assert len(report["images"]) == MAX_IMAGES


@pytest.mark.parametrize("runtime", ["codex", "gemini-cli"])
def test_a_runtime_without_images_refuses_them(environ: dict[str, str], runtime: str) -> None:
    """Codex and Gemini CLI: 422 unsupported_by_runtime at `images`, nothing spawned."""
    services = fake_cli_services(environ, AGENT_RUNTIME=runtime)
    response = _post(services, "/api/task", {"message": "x", "images": [ONE_IMAGE]})
    assert response.status_code == 422
    (issue,) = response.json()["detail"]
    assert (issue["type"], issue["loc"]) == ("unsupported_by_runtime", ["body", "images"])
    assert services.registry.recently_completed() == []

"""The built image itself: its size against the budget, its history and configuration.

The budget (README, "Deployment"): 700 MiB. Claude Code's native executable alone is
about 373 MB; a larger image means something else crept in.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.image.conftest import CA_BUNDLE_VARIABLES, IMAGE, Docker, report_size

SIZE_BUDGET_MIB = 700


def test_the_image_size_is_within_the_budget(
    image: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    """Reported in the session summary; fails past the budget."""
    size_mib = image["Size"] / (1 << 20)
    report_size(
        request.config,
        f"image {IMAGE}: {size_mib:.0f} MiB (budget {SIZE_BUDGET_MIB} MiB), "
        f"{len(image['RootFS']['Layers'])} layers",
    )
    assert size_mib <= SIZE_BUDGET_MIB


def test_no_ca_bundle_in_the_image_history_or_configuration(
    docker: Docker, image: dict[str, Any], ca_needles: dict[str, bytes]
) -> None:
    """`docker history --no-trunc` and the image config name no bundle and hold none."""
    history = docker.run("history", "--no-trunc", "--format", "{{.CreatedBy}}", IMAGE).stdout
    config = json.dumps(image)
    for text in (history, config):
        assert "BEGIN CERTIFICATE" not in text
        assert [label for label, line in ca_needles.items() if line.decode() in text] == []
    env = dict(item.partition("=")[::2] for item in image["Config"]["Env"])
    assert not set(CA_BUNDLE_VARIABLES) & env.keys(), env
    assert not any("/run/secrets" in value for value in env.values()), env

"""The redactor and its logging filter (contract §8)."""

from __future__ import annotations

import io
import logging

import pytest
from pydantic import SecretStr

from agent_server.logs import JsonFormatter
from agent_server.redaction import MASK, RedactingFilter, Redactor

SECRET = "plain-secret-value-1"


@pytest.mark.parametrize(
    ("known", "text", "expected"),
    [
        pytest.param([SECRET], f"a {SECRET} b", f"a {MASK} b", id="an exact known value"),
        pytest.param([SecretStr(SECRET)], SECRET, MASK, id="a SecretStr value"),
        pytest.param(["short7!"], "short7!", "short7!", id="a value under 8 chars is not masked"),
        pytest.param([None, ""], "nothing", "nothing", id="None and empty are ignored"),
        pytest.param(
            ["abcdefgh", "abcdefgh-longer"],
            "abcdefgh-longer",
            MASK,
            id="the longer secret is masked whole",
        ),
        pytest.param([], "key sk-ant-api03-Zz_9-x end", f"key {MASK} end", id="an sk-ant- token"),
        pytest.param(
            [],
            "Authorization: Bearer opaque.gw.tok",
            f"Authorization: Bearer {MASK}",
            id="the value after Authorization: Bearer",
        ),
        pytest.param(["a.b*c+d(e)"], "x a.b*c+d(e) y", f"x {MASK} y", id="regex characters"),
    ],
)
def test_redact(known: list[str | SecretStr | None], text: str, expected: str) -> None:
    """Known values of 8+ characters and token patterns are masked."""
    redactor = Redactor()
    redactor.add(known)
    assert redactor.redact(text) == expected


def test_rotated_out_secrets_stay_masked() -> None:
    """The redactor only grows: an older token is still hidden after a new one is added."""
    redactor = Redactor()
    redactor.add([SECRET])
    redactor.add(["next-secret-value-2"])
    assert redactor.redact(f"{SECRET} next-secret-value-2") == f"{MASK} {MASK}"


def test_redact_value_walks_json() -> None:
    """Strings inside dicts (keys too) and lists are masked; other values pass."""
    redactor = Redactor()
    redactor.add([SECRET])
    value = {"a": [SECRET, 1, None], SECRET: {"b": f"x{SECRET}"}}
    assert redactor.redact_value(value) == {"a": [MASK, 1, None], MASK: {"b": f"x{MASK}"}}


def test_logging_filter_masks_arguments_and_tracebacks() -> None:
    """A secret in a log argument or in an exception never reaches the output."""
    redactor = Redactor()
    redactor.add([SECRET])
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter(redactor))
    logger = logging.getLogger("test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("token %s", SECRET)
        try:
            raise ValueError(SECRET)
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    assert SECRET not in stream.getvalue()
    assert stream.getvalue().count(MASK) == 2

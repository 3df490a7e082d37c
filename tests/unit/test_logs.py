"""Logs (contract §8): one JSON object a line, every record masked by the redactor first."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from agent_server.logs import (
    JsonFormatter,
    LoopDeferredHandler,
    TextFormatter,
    configure_logging,
    execution_id_var,
    logged_name,
)
from agent_server.redaction.redactor import MASK, RedactingFilter, Redactor

SECRET = "unit-log-secret-0123456789"


@pytest.fixture
def redactor() -> Redactor:
    """A redactor that knows SECRET."""
    redactor = Redactor()
    redactor.add([SECRET])
    return redactor


@pytest.fixture
def capture(redactor: Redactor) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A private logger whose one handler is the server's: redacting filter + JSON."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter(redactor))
    logger = logging.getLogger("agent_server.test_logs")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield logger, stream
    logger.removeHandler(handler)
    logger.propagate = True


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_is_one_json_line_with_time_level_logger_message(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    """Even a multi-line message stays one line of JSON with the four base fields."""
    logger, stream = capture
    logger.warning("first line\nsecond line %s", "arg")
    assert len(stream.getvalue().splitlines()) == 1
    (entry,) = _lines(stream)
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "agent_server.test_logs"
    assert entry["message"] == "first line\nsecond line arg"
    assert entry["time"].endswith("+00:00")


def test_a_line_written_during_a_turn_carries_its_execution_id(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    """The execution_id context variable (or an explicit extra) is stamped on the line."""
    logger, stream = capture
    token = execution_id_var.set("exec-ctx-1")
    try:
        logger.info("inside the turn")
    finally:
        execution_id_var.reset(token)
    logger.info("explicit", extra={"execution_id": "exec-extra-2", "key": "ANTHROPIC_API_KEY"})
    logger.info("outside any turn")
    inside, explicit, outside = _lines(stream)
    assert inside["execution_id"] == "exec-ctx-1"
    assert (explicit["execution_id"], explicit["key"]) == ("exec-extra-2", "ANTHROPIC_API_KEY")
    assert "execution_id" not in outside


@pytest.mark.parametrize(
    ("message", "args", "leaked"),
    [
        pytest.param("token is %s", (SECRET,), SECRET, id="a known secret passed as an argument"),
        pytest.param(f"token is {SECRET}", (), SECRET, id="a known secret inside the message"),
        pytest.param(
            "sent %s", ("Authorization: Bearer xyz.opaque.value",), "xyz.opaque", id="bearer header"
        ),
        pytest.param(
            "headers %r",
            ({"authorization": "Bearer abc.dict.repr"},),
            "abc.dict.repr",
            id="bearer header inside a dict repr",
        ),
        pytest.param(
            '"GET /x?h=%s HTTP/1.1"',
            ("Authorization%3A+Bearer+url.encoded.value&y=1",),
            "url.encoded",
            id="bearer header URL-encoded in an access line",
        ),
        pytest.param(
            "key %s", ("sk-ant-api03-AbCdEf_0123-xyz",), "AbCdEf_0123", id="an sk-ant- token"
        ),
    ],
)
def test_a_secret_that_reaches_a_log_call_is_masked(
    capture: tuple[logging.Logger, io.StringIO], message: str, args: tuple[Any, ...], leaked: str
) -> None:
    """Known values and token patterns never reach the written line."""
    logger, stream = capture
    logger.error(message, *args)
    text = stream.getvalue()
    assert leaked not in text
    assert MASK in _lines(stream)[0]["message"]


def test_a_traceback_is_masked_too(capture: tuple[logging.Logger, io.StringIO]) -> None:
    """The exception text of a logged error passes through the redactor as well."""
    logger, stream = capture
    try:
        msg = f"failed with credential {SECRET}"
        raise RuntimeError(msg)
    except RuntimeError:
        logger.exception("boom")
    (entry,) = _lines(stream)
    assert "RuntimeError" in entry["exception"]
    assert SECRET not in stream.getvalue()


def test_a_secret_learned_after_the_record_was_made_is_still_masked(
    redactor: Redactor, capture: tuple[logging.Logger, io.StringIO]
) -> None:
    """The filter reads the redactor at write time: a rotated-in token is masked at once."""
    logger, stream = capture
    fresh = "unit-rotated-secret-9876543210"
    redactor.add([fresh])
    logger.info("rotated to %s", fresh)
    assert fresh not in stream.getvalue()


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Restore the root logger, the uvicorn loggers and warning capture after the test."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    uvicorn = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "uvicorn.access")]
    saved = [(list(u.handlers), u.level, u.disabled, u.propagate) for u in uvicorn]
    yield
    logging.captureWarnings(False)
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)
    for logger, (handlers, level, disabled, propagate) in zip(uvicorn, saved, strict=True):
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.disabled, logger.propagate = disabled, propagate


@pytest.mark.usefixtures("root_logging")
def test_configure_logging_routes_uvicorn_and_warnings_through_the_redactor(
    redactor: Redactor,
) -> None:
    """uvicorn's access and error loggers, and Python warnings, end up as masked JSON lines."""
    stream = io.StringIO()
    # As an in-process uvicorn (log_level="warning") may have left them.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("uvicorn.error").propagate = False
    handler = configure_logging(redactor)
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    logging.getLogger("uvicorn.access").info('127.0.0.1 - "GET /x?t=%s HTTP/1.1" 200', SECRET)
    logging.getLogger("uvicorn.error").info("Uvicorn running on http://127.0.0.1:1")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn(f"deprecated use of {SECRET}", UserWarning, stacklevel=1)
    entries = _lines(stream)
    assert [e["logger"] for e in entries] == ["uvicorn.access", "uvicorn.error", "py.warnings"]
    assert SECRET not in stream.getvalue()


@pytest.mark.usefixtures("root_logging")
def test_configure_logging_twice_keeps_one_server_handler(redactor: Redactor) -> None:
    """Configuring again replaces the server's handler instead of doubling every line."""
    first = configure_logging(redactor)
    second = configure_logging(redactor)
    handlers = logging.getLogger().handlers
    assert second in handlers
    assert first not in handlers


@pytest.mark.usefixtures("root_logging")
def test_text_lines_are_short_and_masked_too(redactor: Redactor) -> None:
    """The text format is one line a record, with the turn's id, and the redactor applies."""
    stream = io.StringIO()
    handler = configure_logging(redactor, log_format="text")
    assert isinstance(handler, logging.StreamHandler)
    assert isinstance(handler.formatter, TextFormatter)
    handler.setStream(stream)
    token = execution_id_var.set("exec-text-1")
    try:
        logging.getLogger("agent_server.turn").warning("sent %s to the CLI", SECRET)
    finally:
        execution_id_var.reset(token)
    (line,) = stream.getvalue().splitlines()
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d WARNING agent_server\.turn: sent \[REDACTED\] to the CLI "
        r"\[execution_id=exec-text-1\]",
        line,
    ), line


@pytest.mark.usefixtures("root_logging")
def test_a_text_traceback_is_masked(redactor: Redactor) -> None:
    """A traceback follows its text line, masked like the message."""
    stream = io.StringIO()
    handler = configure_logging(redactor, log_format="text")
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    try:
        msg = f"failed with credential {SECRET}"
        raise RuntimeError(msg)
    except RuntimeError:
        logging.getLogger("agent_server.app").exception("boom")
    text = stream.getvalue()
    assert "RuntimeError" in text
    assert SECRET not in text
    assert text.splitlines()[0].endswith("agent_server.app: boom")


def test_on_the_event_loop_a_record_is_written_at_its_next_step(redactor: Redactor) -> None:
    """Logged during a request, a record waits for the loop's next step: stamped with its
    turn, its arguments rendered when logged, redacted when written; elsewhere at once."""
    stream = io.StringIO()
    handler = LoopDeferredHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter(redactor))
    logger = logging.getLogger("agent_server.test_logs.deferred")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    async def scenario() -> tuple[str, str]:
        args = ["before"]
        token = execution_id_var.set("turn-1")
        logger.info("in a turn %s %s", args, SECRET)
        execution_id_var.reset(token)
        logger.info("after it")
        args.append("changed")
        before = stream.getvalue()
        await asyncio.sleep(0)
        return before, stream.getvalue()

    try:
        logger.info("at boot")
        assert len(_lines(stream)) == 1
        before, after = asyncio.run(scenario())
    finally:
        logger.removeHandler(handler)
    assert before.count("\n") == 1
    boot, turn, later = (json.loads(line) for line in after.splitlines())
    assert turn["message"] == f"in a turn ['before'] {MASK}"
    assert turn["execution_id"] == "turn-1"
    assert later["message"] == "after it"
    assert "execution_id" not in later
    assert "execution_id" not in boot


@pytest.mark.usefixtures("root_logging")
def test_a_text_line_holds_no_control_character(redactor: Redactor) -> None:
    """Newlines, ESC, U+2028 in a message or a key: escaped, one line, no terminal escape."""
    stream = io.StringIO()
    handler = configure_logging(redactor, log_format="text")
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    hostile = "X\n12:00:00 ERROR forged: line\x1b[2J\u2028_FILE_DESCRIPTOR"
    logging.getLogger("agent_server.spawn_env").warning("key %s", hostile, extra={"key": hostile})
    (line,) = stream.getvalue().splitlines()
    assert "\\x0a12:00:00 ERROR forged" in line
    assert "\\x1b[2J" in line
    assert "\\u2028" in line
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", line)


@pytest.mark.parametrize(
    ("name", "logged"),
    [
        pytest.param("GOOD_NAME_1", "GOOD_NAME_1", id="a plain identifier as it is"),
        pytest.param("A\nB\x1b_FILE_DESCRIPTOR", "'A\\nB\\x1b_FILE_DESCRIPTOR'", id="quoted"),
        pytest.param("X" * 100, repr("X" * 64), id="a long one clipped"),
        pytest.param("KEY\u2028", "'KEY\\u2028'", id="a line break of another reader"),
    ],
)
def test_a_name_the_agent_chose_is_never_logged_raw(name: str, logged: str) -> None:
    """`logged_name`: a plain name, else its escaped, clipped repr."""
    assert logged_name(name) == logged

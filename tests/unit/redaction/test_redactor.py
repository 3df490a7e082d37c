"""The redactor and its logging filter (contract §8)."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from agent_server.logs import JsonFormatter
from agent_server.redaction.redactor import (
    _BATCH_CHARS,
    MASK,
    MAX_CLEAN_DEPTH,
    OWN_LIMIT,
    TOO_DEEP,
    RedactingFilter,
    Redactor,
)
from agent_server.redaction.vocabulary import collect, own_vocabulary, package_root

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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("key Sk-Ant-api03-Zz_9 end", f"key {MASK} end", id="Sk-Ant-"),
        pytest.param("key sK-aNt-api03-Zz_9 end", f"key {MASK} end", id="sK-aNt-"),
        pytest.param("key SK-ANT-API03-ZZ_9 end", f"key {MASK} end", id="SK-ANT-"),
        pytest.param("key \u017fk-ant-api03 end", f"key {MASK} end", id="a long s for the s"),
        pytest.param("key s\u212a-ant-api03 end", f"key {MASK} end", id="a Kelvin sign for the k"),
        pytest.param("é sk-ant-api03-Zz_9 ✓", f"é {MASK} ✓", id="in a text beyond ASCII"),
        pytest.param(
            "authorization: BeaRer opaque.gw.tok",
            f"authorization: BeaRer {MASK}",
            id="BeaRer",
        ),
        pytest.param(
            "Authorization: bEARER opaque.gw.tok ✓",
            f"Authorization: bEARER {MASK} ✓",
            id="bEARER beyond ASCII",
        ),
    ],
)
def test_token_shapes_are_masked_in_any_case(text: str, expected: str) -> None:
    """The token shapes ignore case, and so does the pre-check that spares most texts
    the regex: a mixed-case token is masked, in a text and in a raw output line."""
    redactor = Redactor()
    assert redactor.redact(text) == expected
    assert redactor.redact_bytes(text.encode()) == expected.encode()


def test_only_two_letters_beyond_ascii_stand_for_a_token_letter() -> None:
    """What `token_shapes.maybe_token` assumes of the regex engine: ignoring case, no letter beyond
    ASCII matches a letter of `sk-ant-` or `bearer` but the long s (U+017F)
    and the Kelvin sign (U+212A)."""
    stand_ins = {
        (letter, chr(code))
        for letter in "skantber"
        for code in range(0x80, 0x30000)
        if not 0xD800 <= code <= 0xDFFF
        if re.fullmatch(letter, chr(code), re.IGNORECASE)
    }
    assert stand_ins == {("s", "\u017f"), ("k", "\u212a")}


def test_rotated_out_secrets_stay_masked() -> None:
    """Pinned values stay: an older token is still hidden after a new one is added."""
    redactor = Redactor()
    redactor.add([SECRET])
    redactor.add(["next-secret-value-2"])
    assert redactor.redact(f"{SECRET} next-secret-value-2") == f"{MASK} {MASK}"


def test_clean_walks_json() -> None:
    """String values inside dicts and lists are masked; keys and other values pass."""
    redactor = Redactor()
    redactor.add([SECRET])
    value = {"a": [SECRET, 1, None, True], SECRET: {"b": f"x{SECRET}"}}
    assert redactor.clean(value) == {"a": [MASK, 1, None, True], SECRET: {"b": f"x{MASK}"}}


@pytest.mark.parametrize(
    "word",
    [
        pytest.param("rate_limit", id="an error code"),
        pytest.param("switch_credential", id="a key of the error body"),
        pytest.param("oauth_token", id="a header value"),
        pytest.param("/api/executions/", id="a route"),
        pytest.param("rate_limit_event", id="an event name of the CLI"),
        pytest.param("te_limit", id="a piece of a protocol word"),
    ],
)
def test_a_word_of_the_protocol_is_never_a_secret(word: str) -> None:
    """A `.env` value the server's own code spells is not held: the protocol stays whole."""
    redactor = Redactor()
    redactor.track_dotenv([word, SECRET])
    text = (
        f'{{"error_code":"rate_limit","switch_credential":true}} {word} /api/executions/ {SECRET}'
    )
    assert redactor.redact(text) == text.replace(SECRET, MASK)
    assert redactor.size == 1  # the word is never held


GENERATION = 1764921600123
TURN_ID = "turn-4f1c2a9e7b3d"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(str(GENERATION), id="a generation"),
        pytest.param(str(GENERATION)[2:11], id="digits of a generation"),
        pytest.param(TURN_ID, id="a turn's id"),
        pytest.param("4f1c2a9e7b", id="a piece of a turn's id"),
        pytest.param("2026-12-05T11:22", id="an instant"),
        pytest.param("12:34:56.789", id="a time of day"),
    ],
)
@pytest.mark.parametrize("order", ["own-first", "dotenv-first"])
def test_a_dotenv_value_built_from_the_servers_own_words_masks_nothing(
    value: str, order: str
) -> None:
    """The server's own fields never read `[REDACTED]`, whichever came first."""
    redactor = Redactor()
    if order == "own-first":
        redactor.own([str(GENERATION), TURN_ID])
    redactor.track_dotenv([value, SECRET])
    if order == "dotenv-first":
        redactor.own([str(GENERATION), TURN_ID])
    body = {
        "generation": GENERATION,
        "execution_id": TURN_ID,
        "timestamp": "2026-12-05T11:22:33.456789+00:00",
        "started_at": "12:34:56.789",
        "log": [SECRET],
    }
    assert redactor.clean(body) == {**body, "log": [MASK]}
    assert redactor.size == 1
    redactor.track_dotenv([value, SECRET, "another-secret-1"])  # .env changed: still not held
    assert redactor.size == 2


def test_a_numeric_secret_that_is_no_word_of_ours_is_still_masked() -> None:
    """A PIN in `.env` is masked; only the digits the server wrote itself are spared."""
    redactor = Redactor()
    redactor.own([str(GENERATION)])
    redactor.track_dotenv(["918273645501"])
    assert redactor.clean({"pin": 918273645501, "generation": GENERATION}) == {
        "pin": MASK,
        "generation": GENERATION,
    }


def test_the_redactor_holds_no_more_than_dotenv_whatever_it_offers() -> None:
    """Thousands of spawns whose `.env` holds new pieces of the vocabulary and new own
    words: nothing of them is remembered beyond the current `.env` and `OWN_LIMIT`."""
    redactor = Redactor()
    words = [w for w in own_vocabulary().split("\n") if len(w) >= 8][:2000]
    for index in range(3000):
        redactor.own([f"turn-{index:08d}"])
        redactor.track_dotenv([words[index % len(words)], f"turn-{index:08d}"[1:], SECRET])
    assert redactor.size == 1
    assert len(redactor._own) == min(3000, OWN_LIMIT)
    assert len(redactor._dotenv_words) == 2


def test_the_vocabulary_is_the_servers_own_code() -> None:
    """Its routes, codes, keys and the CLIs' event names are all in it."""
    vocabulary = own_vocabulary()
    for word in ("/api/credentials/reload-token", "no_retained_result", "rate_limit_info"):
        assert word in vocabulary


def test_the_checked_in_vocabulary_is_current() -> None:
    """vocabulary.txt holds exactly the words of today's sources (`make vocabulary`)."""
    assert own_vocabulary() == collect(package_root()), "run `make vocabulary`"


@pytest.mark.parametrize(
    ("value", "cleaned"),
    [
        pytest.param(float("nan"), None, id="NaN is null"),
        pytest.param(float("inf"), None, id="infinity is null"),
        pytest.param(123456789012, MASK, id="a number that spells a secret is masked"),
        pytest.param(1234567890123, MASK, id="a number holding a secret is masked"),
        pytest.param(12345678, 12345678, id="another number passes"),
        pytest.param("half an emoji \ud83d", "half an emoji \ufffd", id="a lone surrogate"),
    ],
)
def test_clean_makes_any_value_valid_json(value: object, cleaned: object) -> None:
    """What `clean` returns always encodes as strict JSON, and a numeric secret is text too."""
    redactor = Redactor()
    redactor.add(["123456789012"])
    result = redactor.clean({"v": value})
    assert result == {"v": cleaned}
    json.dumps(result, allow_nan=False, ensure_ascii=False).encode("utf-8")


def test_clean_returns_a_value_with_nothing_to_change_itself() -> None:
    """No secret, token, surrogate, odd type or number: no copy is made."""
    redactor = Redactor()
    redactor.add([SECRET])
    value = {"a": ["text", 1, 2.5, None, True], "b": {"c": "more"}, "d": []}
    assert redactor.clean(value) is value


@pytest.mark.parametrize(
    "odd",
    [
        pytest.param((1, 2), id="a tuple becomes a list"),
        pytest.param({1: "x"}, id="a key that is not a string"),
        pytest.param("Authorization: Bearer opaque.value", id="a token shape"),
        pytest.param("x" * 70_000 + SECRET, id="a secret past the first batch of texts"),
    ],
)
def test_clean_copies_what_it_must_change(odd: object) -> None:
    """Anything `clean` changes makes it walk the value as before, text by text."""
    redactor = Redactor()
    redactor.add([SECRET])
    value = ["y" * 70_000, odd]
    cleaned = redactor.clean(value)
    assert cleaned is not value
    text = json.dumps(cleaned)
    assert SECRET not in text
    assert "opaque.value" not in text


def test_clean_bounds_the_depth() -> None:
    """A value nested deeper than MAX_CLEAN_DEPTH is cut there, never a RecursionError."""
    value: object = "leaf"
    for _ in range(MAX_CLEAN_DEPTH + 10):
        value = [value]
    cleaned = Redactor().clean(value)
    depth = 0
    while isinstance(cleaned, list):
        cleaned, depth = cleaned[0], depth + 1
    assert (cleaned, depth) == (TOO_DEEP, MAX_CLEAN_DEPTH)


@pytest.mark.parametrize(
    "secret",
    [
        pytest.param('pass"word-with-quote', id="a quote"),
        pytest.param("pässwörd-ümlaut", id="non-ASCII"),
        pytest.param("back\\slash-secret", id="a backslash"),
    ],
)
def test_a_secret_is_found_in_its_json_spelling(secret: str) -> None:
    """Inside a raw stream-json line a secret is JSON-escaped: it is masked there too."""
    redactor = Redactor()
    redactor.add([secret])
    for line in (json.dumps({"t": secret}), json.dumps({"t": secret}, ensure_ascii=False)):
        masked = redactor.redact_bytes(line.encode())
        assert json.loads(masked) == {"t": MASK}


def test_values_that_left_dotenv_age_out_but_pinned_ones_stay() -> None:
    """Departed .env values stay masked for DEPARTED_LIMIT departures, pinned ones forever."""
    redactor = Redactor(departed_limit=2)
    redactor.add(["pinned-controller-token"])
    redactor.track_dotenv(["dotenv-value-one", "dotenv-value-two"])
    assert redactor.size == 3
    redactor.track_dotenv(["dotenv-value-two"])  # one departs
    redactor.track_dotenv(["dotenv-value-three"])  # two departs
    assert redactor.redact("dotenv-value-one") == MASK
    redactor.track_dotenv(["dotenv-value-four"])  # three departs: one is forgotten
    assert redactor.redact("dotenv-value-one") == "dotenv-value-one"
    assert redactor.redact("dotenv-value-two dotenv-value-three") == f"{MASK} {MASK}"
    assert redactor.redact("pinned-controller-token") == MASK
    assert redactor.size == 4


def test_a_value_back_in_dotenv_leaves_the_departed() -> None:
    """A value that returns is current again, not aged out behind newer departures."""
    redactor = Redactor(departed_limit=1)
    redactor.track_dotenv(["dotenv-value-one"])
    redactor.track_dotenv([])
    redactor.track_dotenv(["dotenv-value-one"])
    redactor.track_dotenv(["dotenv-value-two"])
    redactor.track_dotenv(["dotenv-value-three"])  # two departs, pushing one out
    assert redactor.redact("dotenv-value-one") == "dotenv-value-one"


def test_redact_returns_the_same_text_when_nothing_matched() -> None:
    """Callers rely on identity to skip a copy: an untouched text is the same object."""
    redactor = Redactor()
    redactor.add([SECRET])
    text = "nothing secret here at all"
    assert redactor.redact(text) is text
    line = b'{"type": "system"}'
    assert redactor.redact_bytes(line) is line


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


_SECRETS = ["plain-secret-value-1", 'pass"word-with-quote', "pässwörd-ümlaut", "123456789012"]
_texts = st.one_of(
    st.text(max_size=20),  # lone surrogates included
    st.sampled_from(
        [
            *_SECRETS,
            "x plain-secret-value-1 y",
            "sk-ant-api03-Zz_9-x",
            "Authorization: Bearer opaque.gw.tok",
            "plain-secret",  # a secret's first half: the other may follow in the next text
            "-value-1",
        ]
    ),
)
_json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**15), max_value=10**15)
    | st.sampled_from([123456789012, 1234567890123])
    | st.floats()  # NaN and the infinities included
    | _texts,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(_texts, inner, max_size=4)
    ),
    max_leaves=20,
)


@given(value=_json_like)
@settings(max_examples=400, deadline=None)
def test_dumps_is_the_json_of_clean(value: object) -> None:
    """`dumps` is exactly `clean` then `json.dumps`, found in one scan of the text
    however the value hides a secret, a token, a surrogate or a non-finite number."""
    redactor = Redactor()
    redactor.add(_SECRETS)
    expected = json.dumps(
        redactor.clean(value), ensure_ascii=False, allow_nan=False, separators=(",", ":")
    ).encode()
    assert redactor.dumps(value) == expected


@pytest.mark.parametrize("levels", [MAX_CLEAN_DEPTH - 1, MAX_CLEAN_DEPTH, MAX_CLEAN_DEPTH + 1])
@pytest.mark.parametrize("shape", ["lists", "objects", "with strings of brackets beside"])
def test_dumps_cuts_the_depth_where_clean_does(levels: int, shape: str) -> None:
    """Around the depth bound, `dumps` and `clean` agree: nested too deep is cut."""
    value: object = "leaf"
    for level in range(levels):
        if shape == "lists":
            value = [value]
        elif shape == "objects":
            value = {"k": value}
        else:
            value = ["[[{{", value, "}]" * level]
    redactor = Redactor()
    expected = json.dumps(redactor.clean(value), ensure_ascii=False, separators=(",", ":"))
    assert redactor.dumps(value) == expected.encode()
    assert (TOO_DEEP in expected) is (levels > MAX_CLEAN_DEPTH)


@pytest.mark.parametrize("shift", range(-1, len(SECRET) + 1))
def test_dumps_finds_a_secret_across_its_windows(shift: int) -> None:
    """A long answer is scanned a window at a time: a secret on a window's edge, at
    every offset, is masked all the same."""
    redactor = Redactor()
    redactor.add([SECRET])
    prefix = len('{"a":"')
    value = {"a": "x" * (_BATCH_CHARS - prefix - shift) + SECRET + "y" * 10}
    dumped = redactor.dumps(value).decode()
    assert SECRET not in dumped
    assert json.loads(dumped) == {"a": "x" * (_BATCH_CHARS - prefix - shift) + MASK + "y" * 10}

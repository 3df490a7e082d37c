"""Properties of the redact-then-clip order, over random secrets and random cut points.

Whatever the secret and wherever a clip or a tail cut falls, no 8-character piece of
a known secret survives: the text is redacted whole before it is clipped, and a
stderr tail that starts mid-line drops that line.
"""

from __future__ import annotations

import json
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_server.outcome.wording import shape_message
from agent_server.process.pipes import StderrTail
from agent_server.redaction.redactor import Redactor
from agent_server.redaction.vocabulary import own_vocabulary
from agent_server.wire.names import OutcomeKind
from tests.support.contract import leaked

PROPERTY = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

secret_text = st.text(
    alphabet=string.ascii_letters + string.digits + "-_.~+/=401", min_size=8, max_size=60
).filter(lambda secret: secret not in own_vocabulary())
"""Credentials: a value the server's own code spells is never one (the redactor spares it)."""
filler = st.text(alphabet=string.ascii_letters + " .,:;!?\t", max_size=700)


def redactor_for(secret: str) -> Redactor:
    redactor = Redactor()
    redactor.add([secret])
    return redactor


@PROPERTY
@given(secret=secret_text, before=filler, after=filler, kind=st.sampled_from(list(OutcomeKind)))
def test_a_shaped_message_holds_no_piece_of_the_secret(
    secret: str, before: str, after: str, kind: OutcomeKind
) -> None:
    """Redact, then collapse, clip to 500 and scrub auth words: nothing of the secret left."""
    message = shape_message(redactor_for(secret).redact(before + secret + after), kind)
    assert not leaked(secret, message)


@PROPERTY
@given(
    secret=secret_text,
    before=st.integers(min_value=0, max_value=300),
    after=st.integers(min_value=0, max_value=300),
    tail=st.integers(min_value=16, max_value=400),
    chunk=st.integers(min_value=1, max_value=97),
)
def test_a_stderr_tail_cut_anywhere_holds_no_piece_of_the_secret(
    secret: str, before: int, after: int, tail: int, chunk: int
) -> None:
    """However stderr arrives and wherever the tail starts, its redaction leaves no piece."""
    kept = StderrTail(tail)
    data = ("A" * before + secret + "\n" + "B" * after).encode()
    for start in range(0, len(data), chunk):
        kept.feed(data[start : start + chunk])
    assert not leaked(secret, redactor_for(secret).redact(kept.text()))


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), filler)


@PROPERTY
@given(
    secret=secret_text,
    value=st.recursive(
        json_leaf,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(filler, inner, max_size=4),
        max_leaves=20,
    ),
    where=st.sampled_from(["value", "inside"]),
)
def test_clean_leaves_no_secret_and_always_valid_json(
    secret: str, value: object, where: str
) -> None:
    """The secret as a value or inside a string: gone; NaN and surrogates too. (A key
    is the server's own, or was masked as its line arrived: the gate leaves keys.)"""
    planted: object
    if where == "value":
        planted = {"v": value, "s": secret}
    else:
        planted = [value, f"<<{secret}>>", float("nan"), "\ud800"]
    cleaned = redactor_for(secret).clean(planted)
    text = json.dumps(cleaned, ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")
    assert secret not in text

"""`auth_ladder` is taken only where the broker can use it (contract §6.2)."""

from __future__ import annotations

import pytest

from agent_server.errors import RequestInvalid
from agent_server.execution.ask import TurnAsk
from agent_server.turn_models import AuthOverride, ParallelTaskRequest

OAUTH = {"oauth_token": "tsecladderoauth0123456789"}
KEY = {"api_key": "tsecladderkey0123456789"}


def ask(override: dict[str, str] | None, *ladder: dict[str, str]) -> TurnAsk:
    return TurnAsk(
        message="hi",
        auth_override=AuthOverride.model_validate(override) if override else None,
        auth_ladder=tuple(AuthOverride.model_validate(rung) for rung in ladder),
    )


@pytest.mark.parametrize(
    ("case", "turn", "brokered", "problem"),
    [
        ("no ladder is always fine", ask(OAUTH), False, None),
        ("a ladder of the override's kind, brokered", ask(OAUTH, OAUTH), True, None),
        ("a ladder without the broker", ask(OAUTH, OAUTH), False, "needs the broker"),
        ("a ladder with no override to go after", ask(None, OAUTH), True, "needs an auth_override"),
        ("a rung of another kind", ask(OAUTH, KEY), True, "of the auth_override's kind"),
    ],
)
def test_a_ladder_is_refused_where_it_cannot_serve(
    case: str, turn: TurnAsk, brokered: bool, problem: str | None
) -> None:
    """422 at `auth_ladder`, saying why; nothing runs."""
    if problem is None:
        turn.refuse_unusable_ladder(brokered)
        return
    with pytest.raises(RequestInvalid) as refused:
        turn.refuse_unusable_ladder(brokered)
    (error,) = refused.value.errors
    assert error["loc"] == ["body", "auth_ladder"]
    assert problem in error["msg"], case


def test_a_ladder_holds_at_most_eight_credentials() -> None:
    """Nine are a 422 of the body, as any bad field."""
    with pytest.raises(ValueError, match="at most 8"):
        ParallelTaskRequest.model_validate({"message": "hi", "auth_ladder": [OAUTH] * 9})

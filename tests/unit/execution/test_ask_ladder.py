"""`auth_ladder` is used only where the broker can use it (contract §6.2)."""

from __future__ import annotations

import pytest

from agent_server.execution.ask import TurnAsk
from agent_server.wire.turns import AuthOverride, ParallelTaskRequest

OAUTH = {"oauth_token": "tsecladderoauth0123456789"}
KEY = {"api_key": "tsecladderkey0123456789"}


def ask(override: dict[str, str] | None, *ladder: dict[str, str]) -> TurnAsk:
    return TurnAsk(
        message="hi",
        auth_override=AuthOverride.model_validate(override) if override else None,
        auth_ladder=tuple(AuthOverride.model_validate(rung) for rung in ladder),
    )


@pytest.mark.parametrize(
    ("case", "turn", "brokered", "used", "why"),
    [
        ("no ladder", ask(OAUTH), False, 0, None),
        ("a ladder of the override's kind, brokered", ask(OAUTH, OAUTH, OAUTH), True, 2, None),
        ("a ladder without the broker", ask(OAUTH, OAUTH), False, 0, "needs the broker"),
        ("a ladder with no override to go after", ask(None, OAUTH), True, 0, "an auth_override"),
        (
            "a rung of another kind is left out",
            ask(OAUTH, KEY, OAUTH),
            True,
            1,
            "kind (oauth_token)",
        ),
    ],
)
def test_only_the_rungs_the_broker_can_use_are_kept(
    case: str, turn: TurnAsk, brokered: bool, used: int, why: str | None
) -> None:
    """A schema-valid ladder is never refused: what cannot serve is left out, and why is
    said (the turn runs, as an override does on a runtime that cannot take it)."""
    ladder, left_out = turn.usable_ladder(brokered)
    assert len(ladder) == used, case
    assert all(rung.kind == "oauth_token" for rung in ladder)
    if why is None:
        assert left_out is None
    else:
        assert left_out is not None and why in left_out, case


def test_a_ladder_holds_at_most_eight_credentials() -> None:
    """Nine are a 422 of the body, as any bad field."""
    with pytest.raises(ValueError, match="at most 8"):
        ParallelTaskRequest.model_validate({"message": "hi", "auth_ladder": [OAUTH] * 9})

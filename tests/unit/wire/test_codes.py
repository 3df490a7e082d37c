"""One table of the server's refusals: the server raises each code, the controller maps each."""

from __future__ import annotations

import pytest

from agent_server import errors as server
from agent_server.controller import errors as controller
from agent_server.wire import codes


def _server_classes() -> list[type[server.ApiError]]:
    found: list[type[server.ApiError]] = [server.ApiError]
    pending = [server.ApiError]
    while pending:
        for subclass in pending.pop().__subclasses__():
            found.append(subclass)
            pending.append(subclass)
    return found


def test_every_server_refusal_is_in_the_table() -> None:
    """Each ApiError answers a code, status and retryable flag the table holds."""
    table = {(r.code, r.status, r.retryable) for r in codes.REFUSALS}
    for kind in _server_classes():
        assert (kind.error_code, kind.status, kind.retryable) in table, kind.__name__


def test_every_refusal_in_the_table_is_mapped_by_the_controller() -> None:
    """As httpx does: no code of the server's falls through to the generic AgentError
    unless the table says it is an internal one."""
    mapped = controller._BY_CODE
    assert {r.code for r in codes.REFUSALS} == set(mapped)


@pytest.mark.parametrize("name", ["Busy", "NotFound", "GenerationMismatch", "ExecutionInProgress"])
def test_a_name_on_both_sides_means_one_code(name: str) -> None:
    """The server's `Busy` is read back as the controller's `Busy`, through one code."""
    raised: type[server.ApiError] = getattr(server, name)
    assert controller._BY_CODE[raised.error_code] is getattr(controller, name)

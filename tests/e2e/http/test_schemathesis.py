"""Schemathesis against a live server's own /openapi.json: no 5xx, answers match the contract.

Valid and invalid requests are generated for every route of the ENDPOINTS table,
deterministically (derandomized, no example database). The server runs the fake Claude
CLI, which answers at once, and a large AGENT_SERVER_MAX_PARALLEL keeps `busy` out of
the picture; a valid `timeout_seconds` below 30 is raised to 30, so that a slow machine
cannot turn a quick turn into a 504.
"""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from agent_server.app import ENDPOINTS
from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.server import CONTROLLER_TOKEN, ServerProcess

HEADERS = {"X-Trinity-Agent-Token": CONTROLLER_TOKEN}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    positive_data_acceptance,
]
MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
MAX_EXAMPLES = 40
"""Per operation: enough to reach each field's edges, small enough for about 15 s in all."""
MIN_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def live_schema(
    module_turn_servers: TurnServers, secret_registry: SecretRegistry
) -> schemathesis.BaseSchema:
    """The contract of a live server (fetched with the controller token), aimed at it."""
    server: ServerProcess = module_turn_servers.start(
        CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("schemathesis_oauth"),
        AGENT_SERVER_MAX_PARALLEL="1000",
    )
    schema = schemathesis.openapi.from_url(
        f"{server.base_url}/openapi.json", headers=HEADERS, timeout=10
    )
    schema.config.update(base_url=server.base_url)
    return schema


@pytest.mark.parametrize(
    ("method", "path"), [(e.method, e.path) for e in ENDPOINTS], ids=lambda v: str(v)
)
def test_operation_honours_the_contract(
    live_schema: schemathesis.BaseSchema, method: str, path: str
) -> None:
    """Generated requests to one route get non-5xx answers that its OpenAPI responses describe."""
    operation = live_schema[path][method]
    cases = st.one_of([operation.as_strategy(generation_mode=mode) for mode in MODES])

    @hypothesis.given(case=cases)
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    def exercise(case: schemathesis.Case) -> None:
        _unhurried(case)
        case.call_and_validate(headers=HEADERS, checks=CHECKS, timeout=60)

    exercise()


def _unhurried(case: schemathesis.Case) -> None:
    """Raise a valid but tiny `timeout_seconds` (1 is a favourite edge) to MIN_TIMEOUT_S.

    The fake CLI answers in a fraction of a second, but on a loaded machine a 1 s deadline
    could fire and answer 504: the test would then measure the machine, not the contract.
    """
    body = case.body
    if isinstance(body, dict):
        timeout = body.get("timeout_seconds")
        if type(timeout) is int and 1 <= timeout < MIN_TIMEOUT_S:
            body["timeout_seconds"] = MIN_TIMEOUT_S

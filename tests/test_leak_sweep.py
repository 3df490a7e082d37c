"""The leak sweep (issue 6): no credential in any log line or response body of the suite.

Every real server the suite starts writes its JSON log, and every response body a
test receives from it, beside each other under the session's temp dir
(`tests/support/server.py`). This test runs last and reads all of them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import SecretRegistry
from tests.support.server import CONTROLLER_TOKEN, read_bodies

# A token-shaped value the redactor's pattern should have masked.
UNMASKED_TOKEN = re.compile(r"sk-ant-[A-Za-z0-9_\-]{6,}")


# It sweeps what the servers of the end-to-end and image tiers wrote: selected with either.
@pytest.mark.leak_sweep
@pytest.mark.e2e
@pytest.mark.image
def test_no_credential_in_any_log_line_or_body_of_the_suite(
    tmp_path_factory: pytest.TempPathFactory,
    secret_registry: SecretRegistry,
    end_to_end_tests_ran: int,
) -> None:
    """Every server log and response body of this session is free of every test secret."""
    if not end_to_end_tests_ran:
        pytest.skip("no end-to-end test ran in this session: nothing to sweep")
    root = tmp_path_factory.getbasetemp()
    logs = sorted(root.rglob("*.log"))
    bodies = [Path(f"{log}.bodies") for log in logs if Path(f"{log}.bodies").exists()]
    assert len(logs) >= 10, f"the sweep found only {len(logs)} server logs under {root}"
    assert len(bodies) >= 10, f"the sweep found only {len(bodies)} body files under {root}"
    secret_registry.add("the shared controller token", CONTROLLER_TOKEN)
    texts: dict[str, str] = {}
    for log in logs:
        texts[str(log)] = log.read_text(errors="replace")
    for path in bodies:
        texts[str(path)] = "\n".join(read_bodies(path))
    leaked = {
        name: found for name, text in texts.items() if (found := secret_registry.leaks([text]))
    }
    assert leaked == {}, f"credentials leaked: {leaked}"
    unmasked = {name: UNMASKED_TOKEN.findall(text)[:3] for name, text in texts.items()}
    assert {k: v for k, v in unmasked.items() if v} == {}

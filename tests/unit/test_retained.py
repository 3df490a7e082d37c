"""Retained results (contract §6.6) and the envelope they hold: crash-safe 0600 records,
the last terminal standing, TTL, count and size eviction, ids that name no path."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_server.execution.outcome import ERROR_CODES
from agent_server.metrics import Metrics
from agent_server.records import retained
from agent_server.records.envelope import (
    MAX_RESPONSE_CHARS,
    TRINITY_CODES,
    bound_log,
    envelope_of,
)
from agent_server.records.results import Results
from agent_server.records.retained import RetainedResults
from agent_server.redaction import MASK, Redactor
from agent_server.secret_file import json_chunks, read_json_file, write_json_file
from agent_server.turn_models import ResultEnvelope, RetainedResult
from tests.support.contract import ERROR_DETAIL_KEYS

# What Trinity's backend keeps (services/execution_envelope.py, TaskExecutionErrorCode):
# any other error_code is dropped there, and the result loses its cause.
TRINITY_ERROR_CODES = frozenset(
    {
        "timeout", "capacity", "auth", "billing", "agent_error", "network", "circuit_open",
        "reconciled", "lease_expired", "skill_not_found", "ephemeral_exhausted",
        "model_unsupported",
    }
)  # fmt: skip


def _success(execution_id: str = "e-1", response: str = "done") -> dict[str, Any]:
    body = {
        "status": "success",
        "response": response,
        "execution_log": [{"type": "result"}],
        "session_id": "s-1",
        "timestamp": "2026-12-01T00:00:00+00:00",
        "metadata": _metadata(execution_id),
    }
    return envelope_of(execution_id, 200, body, auth_route="api_key", elapsed_ms=1500)


def _metadata(execution_id: str) -> dict[str, Any]:
    return {"execution_id": execution_id, "context_window": 200_000, "auth_route": "api_key",
            "generation": 1}  # fmt: skip


def _failure(error_code: str, status: int = 429) -> dict[str, Any]:
    detail = {key: None for key in ERROR_DETAIL_KEYS}
    detail |= {
        "message": "x" * 900,
        "error_code": error_code,
        "retryable": False,
        "switch_credential": True,
        "execution_id": "e-2",
        "auth_route": "baseline",
        "metadata": _metadata("e-2") | {"session_id": "s-2"},
        "execution_log": [],
    }
    return envelope_of("e-2", status, {"detail": detail}, auth_route="baseline", elapsed_ms=7)


# --- the envelope ------------------------------------------------------------------------


def test_a_success_envelope_is_trinitys_shape_and_ours() -> None:
    """status, response, terminal_reason completed, and the route and status beside them."""
    envelope = bound_log(_success())
    ResultEnvelope.model_validate(envelope)
    assert (envelope["status"], envelope["terminal_reason"]) == ("success", "completed")
    assert (envelope["auth_route"], envelope["http_status"]) == ("api_key", 200)
    assert (envelope["error"], envelope["error_code"], envelope["detail"]) == (None, None, None)
    assert envelope["execution_time_ms"] == 1500
    assert envelope["truncated_log"] is False


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_every_error_code_maps_to_one_trinity_keeps(code: str) -> None:
    """A failure: Trinity's code, the message cut to 500, ours kept in `detail`."""
    envelope = bound_log(_failure(code))
    ResultEnvelope.model_validate(envelope)
    assert envelope["status"] == "failed"
    assert envelope["error_code"] in TRINITY_ERROR_CODES
    assert len(envelope["error"]) == 500
    assert envelope["detail"]["error_code"] == code
    assert envelope["detail"]["switch_credential"] is True
    assert "metadata" not in envelope["detail"]
    assert envelope["session_id"] == "s-2"


def test_the_mapping_covers_every_outcome() -> None:
    """No §7 code falls through to the catch-all by accident."""
    assert set(TRINITY_CODES) == set(ERROR_CODES)


def test_a_cancel_is_cancelled_and_a_long_response_is_cut_to_what_the_callback_takes() -> None:
    """`cancelled` with its reason; a response past 4,000,000 characters is cut and says so."""
    body = {"status": "cancelled", "response": "y" * (MAX_RESPONSE_CHARS + 5), "metadata": None}
    envelope = envelope_of("e-3", 200, body, auth_route="baseline", elapsed_ms=0)
    assert (envelope["status"], envelope["terminal_reason"]) == ("cancelled", "cancelled")
    assert len(envelope["response"]) == MAX_RESPONSE_CHARS
    assert envelope["response_truncated"] is True


def test_a_log_past_the_limit_is_left_out_and_flagged() -> None:
    """bound_log: over the limit the log is null and `truncated_log` true; else untouched."""
    envelope = _success()
    assert bound_log(envelope, limit=10)["execution_log"] is None
    assert bound_log(envelope, limit=10)["truncated_log"] is True
    assert bound_log(envelope)["execution_log"] == [{"type": "result"}]


# --- the store ---------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> RetainedResults:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    return RetainedResults(state / "results")


def test_a_record_is_a_0600_file_read_back_by_a_new_store(store: RetainedResults) -> None:
    """Written crash-safely at 0600 in a 0700 directory; a restart reads it as it was."""
    store.keep("e-1", bound_log(_success()))
    path = store.directory / "e-1.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    record = RetainedResults(store.directory).get("e-1")
    assert record is not None
    RetainedResult.model_validate(record)
    assert record["response"] == "done"
    assert [p.name for p in store.directory.iterdir()] == ["e-1.json"]  # no temp file left


def test_the_last_terminal_answer_stands(store: RetainedResults) -> None:
    """A retry under the same id overwrites its record."""
    store.keep("e-1", bound_log(_failure("rate_limit")))
    store.keep("e-1", bound_log(_success(response="second")))
    record = store.get("e-1")
    assert record is not None
    assert (record["status"], record["response"]) == ("success", "second")


@pytest.mark.parametrize(
    "execution_id",
    ["../oauth-token", "a/b", "", "x" * 129, "..", "e-1\n", "e-1.json", "%2e%2e"],
)
def test_an_id_that_could_name_a_path_is_never_used(
    store: RetainedResults, execution_id: str
) -> None:
    """get answers None and keep refuses: no file outside (or inside) is touched."""
    store.keep("e-1", bound_log(_success()))
    assert store.get(execution_id) is None
    with pytest.raises(ValueError, match="not an execution id"):
        store.keep(execution_id, bound_log(_success()))
    assert [p.name for p in store.directory.iterdir()] == ["e-1.json"]


def test_an_expired_record_is_gone_with_the_next_write(tmp_path: Path) -> None:
    """Past the TTL a record reads as unknown, and the next write deletes it."""
    tmp_path.chmod(0o700)
    store = RetainedResults(tmp_path / "results", ttl_s=0.2)
    store.keep("old", bound_log(_success("old")))
    time.sleep(0.4)
    assert store.get("old") is None
    store.keep("new", bound_log(_success("new")))
    assert sorted(p.name for p in store.directory.iterdir()) == ["new.json"]


def test_a_record_aged_behind_the_store_goes_at_the_next_listing(
    store: RetainedResults, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store trusts what it wrote for `RELIST_S`, then lists the directory again:
    a record whose file is older than it knew goes then."""
    store.keep("old", bound_log(_success("old")))
    past = time.time() - store.ttl_s - 1
    os.utime(store.directory / "old.json", (past, past))
    assert store.get("old") is None
    store.keep("new", bound_log(_success("new")))
    assert (store.directory / "old.json").exists()  # not listed yet
    monkeypatch.setattr(retained, "RELIST_S", 0.0)
    store.keep("newer", bound_log(_success("newer")))
    assert sorted(p.name for p in store.directory.iterdir()) == ["new.json", "newer.json"]


def test_records_written_behind_the_store_count_from_the_next_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files another process put there, or took away, are learnt at the next listing;
    the count holds from then on."""
    tmp_path.chmod(0o700)
    store = RetainedResults(tmp_path / "results", max_results=3)
    store.keep("e-0", bound_log(_success("e-0")))
    (store.directory / "e-0.json").unlink()  # taken away: never an error
    past = time.time() - 10
    for index in (1, 2, 3):
        (store.directory / f"x-{index}.json").write_text("{}")
        os.utime(store.directory / f"x-{index}.json", (past + index, past + index))
    store.keep("e-4", bound_log(_success("e-4")))
    assert len(list(store.directory.iterdir())) == 4  # not listed yet
    monkeypatch.setattr(retained, "RELIST_S", 0.0)
    store.keep("e-5", bound_log(_success("e-5")))
    assert sorted(p.name for p in store.directory.iterdir()) == ["e-4.json", "e-5.json", "x-3.json"]


def test_the_oldest_go_past_the_count(tmp_path: Path) -> None:
    """With room for 3, the fourth write evicts the oldest."""
    tmp_path.chmod(0o700)
    store = RetainedResults(tmp_path / "results", max_results=3)
    for index in range(4):
        store.keep(f"e-{index}", bound_log(_success(f"e-{index}")))
        stamp = time.time() - 100 + index
        os.utime(store.directory / f"e-{index}.json", (stamp, stamp))
    store.evict()
    assert sorted(p.name for p in store.directory.iterdir()) == ["e-1.json", "e-2.json", "e-3.json"]


def test_the_oldest_go_past_the_bytes(tmp_path: Path) -> None:
    """With room for about two records' bytes, a third write leaves two."""
    tmp_path.chmod(0o700)
    size = len(json.dumps(bound_log(_success("e-0", response="z" * 5000))))
    store = RetainedResults(tmp_path / "results", max_bytes=int(size * 2.5))
    for index in range(3):
        store.keep(f"e-{index}", bound_log(_success(f"e-{index}", response="z" * 5000)))
        stamp = time.time() - 100 + index
        os.utime(store.directory / f"e-{index}.json", (stamp, stamp))
    store.evict()
    assert sorted(p.name for p in store.directory.iterdir()) == ["e-1.json", "e-2.json"]


def test_an_unreadable_record_is_unknown_never_an_error(store: RetainedResults) -> None:
    """Corrupt JSON, a symlink, a FIFO: None, at once."""
    store.keep("e-1", bound_log(_success()))
    (store.directory / "bad.json").write_text("{not json")
    (store.directory / "link.json").symlink_to(store.directory / "e-1.json")
    os.mkfifo(store.directory / "fifo.json")
    assert [store.get(name) for name in ("bad", "link", "fifo")] == [None, None, None]


def test_a_crash_left_temp_file_is_swept_once_stale(store: RetainedResults) -> None:
    """A `.tmp.` file an interrupted write left goes after an hour, not before."""
    store.keep("e-1", bound_log(_success()))
    fresh = store.directory / "e-2.json.tmp.aaaa"
    stale = store.directory / "e-3.json.tmp.bbbb"
    fresh.write_text("{")
    stale.write_text("{")
    past = time.time() - 7200
    os.utime(stale, (past, past))
    store.evict()
    assert fresh.exists()
    assert not stale.exists()


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    """A state dir others may write is refused: OSError, and no file appears."""
    tmp_path.chmod(0o777)
    store = RetainedResults(tmp_path / "results")
    (tmp_path / "results").mkdir(mode=0o700)
    tmp_path.chmod(0o700)
    (tmp_path / "results").chmod(0o777)
    with pytest.raises(OSError, match="writable by group or others"):
        store.keep("e-1", bound_log(_success()))
    assert list((tmp_path / "results").iterdir()) == []


# --- Results: what a turn's settle leads to ------------------------------------------------


def test_the_retained_record_is_redacted_and_the_answer_untouched(tmp_path: Path) -> None:
    """A secret the answer still holds is masked in the record; settle changes nothing
    of the body the HTTP answer is built from, and returns before the record exists."""
    secret = "sk-ant-oat01-" + "q" * 40
    redactor = Redactor()
    redactor.add([secret])
    store = RetainedResults(tmp_path / "results")
    results = Results(store, redactor, Metrics(), callbacks=None)
    body = {
        "status": "success",
        "response": f"the key is {secret}",
        "execution_log": [{"type": "result", "result": secret}],
        "session_id": "s-1",
        "metadata": _metadata("e-1"),
    }

    async def scenario() -> bool:
        results.settle("e-1", 200, body, auth_route="baseline", elapsed_ms=5)
        kept_at_once = store.get("e-1") is not None
        await results.close(5.0)
        return kept_at_once

    assert asyncio.run(scenario()) is False
    assert body["response"] == f"the key is {secret}"
    text = (tmp_path / "results" / "e-1.json").read_text()
    assert secret not in text
    record = store.get("e-1")
    assert record is not None
    assert record["response"] == f"the key is {MASK}"
    assert record["execution_log"] == [{"type": "result", "result": MASK}]


# --- JSON records written in pieces --------------------------------------------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=600) | st.dictionaries(st.text(), inner),
    max_leaves=2000,
)


@settings(max_examples=60, deadline=None)
@given(_JSON)
def test_json_in_pieces_is_the_same_json(value: Any) -> None:
    """Joined, the pieces are exactly the one-shot compact JSON of the value."""
    whole = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert "".join(json_chunks(value)) == whole


def test_a_large_log_is_written_in_pieces_and_read_back(tmp_path: Path) -> None:
    """A record whose log is far past one piece reads back equal; no piece holds it all."""
    record = {
        "execution_id": "e-1",
        "execution_log": [{"type": "x", "n": i} for i in range(50_000)],
    }
    pieces = list(json_chunks(record))
    assert max(len(piece) for piece in pieces) < len(json.dumps(record)) // 10
    write_json_file(tmp_path / "r.json", record)
    assert read_json_file(tmp_path / "r.json", 10**7) == record


def test_a_record_of_small_pieces_is_written_in_few_writes(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A record's many small pieces are written together, not a system call each; a
    long piece goes as it is (a megabyte a write), and the file is the record's JSON."""
    writes: list[int] = []
    write = os.write

    def counted(fd: int, data: Any) -> int:
        writes.append(len(data))
        return write(fd, data)

    monkeypatch.setattr(os, "write", counted)
    record = {"execution_id": "e-1", "metadata": {f"k{i}": i for i in range(200)}}
    write_json_file(tmp_path / "small.json", record)
    assert len(writes) == 1
    assert read_json_file(tmp_path / "small.json", 10**7) == record

    writes.clear()
    big = {"a": 1, "response": "x" * (3 << 20), "b": 2}
    write_json_file(tmp_path / "big.json", big)
    # `{"a":1,"response":`, the text's 3 MiB and 2 quotes a MiB at a time, `,"b":2}`
    assert writes == [18, 1 << 20, 1 << 20, 1 << 20, 2, 7]
    assert read_json_file(tmp_path / "big.json", 10**8) == big


def test_a_value_json_cannot_hold_leaves_no_file(tmp_path: Path) -> None:
    """NaN fails the write part-way: no record, no temp file."""
    with pytest.raises(ValueError, match="JSON compliant"):
        write_json_file(tmp_path / "r.json", {"a": list(range(600)), "b": float("nan")})
    assert list(tmp_path.iterdir()) == []


def test_a_record_never_reads_past_its_limit(tmp_path: Path, monkeypatch: Any) -> None:
    """The bound holds for the bytes read, not only for the size fstat saw: a file that
    grew after it (here: fstat reports it small) is refused."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"a": "x" * 100}))
    assert read_json_file(path, 50) is None
    real_fstat = os.fstat

    def fstat_before_growth(fd: int) -> Any:
        st = real_fstat(fd)
        return os.stat_result((*st[:6], 10, *st[7:10]))  # st_size = 10

    monkeypatch.setattr("agent_server.secret_file.os.fstat", fstat_before_growth)
    assert read_json_file(path, 50) is None
    assert read_json_file(path, 10**6) is not None

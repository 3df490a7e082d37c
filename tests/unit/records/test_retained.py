"""Retained results (contract §6.6): crash-safe 0600 records, the last terminal standing,
TTL, count and size eviction, ids that name no path, and nothing planted taken for a
record; and `Results`, which serves a settled answer before its write lands."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path

import pytest

from agent_server.metrics import Metrics
from agent_server.records import files
from agent_server.records.envelope import bound_log
from agent_server.records.results import Results
from agent_server.records.retained import MAX_RECORD_BYTES, RetainedResults
from agent_server.redaction.redactor import MASK, Redactor
from agent_server.wire.results import RetainedResult
from tests.support.envelopes import failure, metadata, success


@pytest.fixture
def store(tmp_path: Path) -> RetainedResults:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    return RetainedResults(state / "results")


def _dir(store: RetainedResults) -> Path:
    return store.files.directory


def _names(store: RetainedResults) -> list[str]:
    return sorted(p.name for p in _dir(store).iterdir())


def _age(path: Path, seconds: float) -> None:
    stamp = time.time() - seconds
    os.utime(path, (stamp, stamp))


def test_a_record_is_a_0600_file_read_back_by_a_new_store(store: RetainedResults) -> None:
    """Written crash-safely at 0600 in a 0700 directory; a restart reads it as it was."""
    store.keep(bound_log(success("e-1")))
    path = _dir(store) / "e-1.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(_dir(store).stat().st_mode) == 0o700
    record = RetainedResults(_dir(store)).get("e-1")
    assert record is not None
    RetainedResult.model_validate({**record, "retained_at": "2026-12-01T00:00:00Z"})
    assert record["response"] == "done"
    assert _names(store) == ["e-1.json"]  # no temp file left


def test_a_record_is_streamed_a_chunk_at_a_time(store: RetainedResults) -> None:
    """The reader yields the file's bytes in chunks of at most 64 KiB, never whole."""
    store.keep(bound_log(success("e-1", response="z" * 300_000)))
    reader = store.reader("e-1")
    assert reader is not None
    chunks = list(reader.chunks())
    assert max(map(len, chunks)) <= 64 * 1024
    assert b"".join(chunks) == (_dir(store) / "e-1.json").read_bytes()
    assert reader.size == sum(map(len, chunks))


def test_the_last_terminal_answer_stands(store: RetainedResults) -> None:
    """A retry under the same id overwrites its record."""
    store.keep(bound_log(failure("rate_limit", execution_id="e-1")))
    store.keep(bound_log(success("e-1", response="second")))
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
    store.keep(bound_log(success("e-1")))
    assert store.get(execution_id) is None
    with pytest.raises(ValueError, match="not an execution id"):
        store.keep(bound_log(success(execution_id)))
    assert _names(store) == ["e-1.json"]


@pytest.mark.parametrize(
    ("name", "content"),
    [
        pytest.param("forged", b'{"execution_id":"other","status":"success"}', id="another id"),
        pytest.param("forged", b'{"status":"success","execution_id":"forged"}', id="id not first"),
        pytest.param("forged", b"{not json", id="not JSON"),
        pytest.param("forged", b"", id="empty"),
    ],
)
def test_a_file_that_is_not_its_names_record_is_no_record(
    store: RetainedResults, name: str, content: bytes
) -> None:
    """A record begins with the id it is named by, as the server writes it; else unknown."""
    _dir(store).mkdir(mode=0o700, exist_ok=True)
    (_dir(store) / f"{name}.json").write_bytes(content)
    assert store.reader(name) is None


def test_a_symlink_a_fifo_or_an_oversized_file_is_unknown_at_once(store: RetainedResults) -> None:
    """Never followed, never waited on, never read past its bound."""
    store.keep(bound_log(success("e-1")))
    (_dir(store) / "link.json").symlink_to(_dir(store) / "e-1.json")
    os.mkfifo(_dir(store) / "fifo.json")
    with (_dir(store) / "huge.json").open("wb") as huge:
        huge.truncate(MAX_RECORD_BYTES + 1)
    assert [store.reader(name) for name in ("link", "fifo", "huge")] == [None, None, None]


def test_an_expired_record_is_gone_with_the_next_write(tmp_path: Path) -> None:
    """Past the TTL a record reads as unknown, and the next write deletes it."""
    tmp_path.chmod(0o700)
    store = RetainedResults(tmp_path / "results", ttl_s=0.2)
    store.keep(bound_log(success("old")))
    time.sleep(0.4)
    assert store.get("old") is None
    store.keep(bound_log(success("new")))
    assert _names(store) == ["new.json"]


def test_a_future_mtime_is_not_fresh(
    store: RetainedResults, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record stamped in the future (planted, or a clock gone wrong) is unknown and goes
    first at the next listing."""
    store.keep(bound_log(success("e-1")))
    future = time.time() + 3600
    os.utime(_dir(store) / "e-1.json", (future, future))
    assert store.reader("e-1") is None
    monkeypatch.setattr(files, "RELIST_S", 0.0)
    store.keep(bound_log(success("e-2")))
    assert _names(store) == ["e-2.json"]


def test_a_record_aged_behind_the_store_goes_at_the_next_listing(
    store: RetainedResults, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store trusts what it wrote for `RELIST_S`, then lists the directory again:
    a record whose file is older than it knew goes then."""
    store.keep(bound_log(success("old")))
    _age(_dir(store) / "old.json", store.files.bounds.ttl_s + 1)
    assert store.get("old") is None
    store.keep(bound_log(success("new")))
    assert (_dir(store) / "old.json").exists()  # not listed yet
    monkeypatch.setattr(files, "RELIST_S", 0.0)
    store.keep(bound_log(success("newer")))
    assert _names(store) == ["new.json", "newer.json"]


def test_records_written_behind_the_store_count_from_the_next_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files another process put there, or took away, are learnt at the next listing;
    the count holds from then on."""
    tmp_path.chmod(0o700)
    store = RetainedResults(tmp_path / "results", max_results=3)
    store.keep(bound_log(success("e-0")))
    (_dir(store) / "e-0.json").unlink()  # taken away: never an error
    for index in (1, 2, 3):
        (_dir(store) / f"x-{index}.json").write_text("{}")
        _age(_dir(store) / f"x-{index}.json", 10 - index)
    store.keep(bound_log(success("e-4")))
    assert len(_names(store)) == 4  # not listed yet
    monkeypatch.setattr(files, "RELIST_S", 0.0)
    store.keep(bound_log(success("e-5")))
    assert _names(store) == ["e-4.json", "e-5.json", "x-3.json"]


def test_the_oldest_go_past_the_count(tmp_path: Path) -> None:
    """With room for 3, the fourth record evicts the oldest."""
    tmp_path.chmod(0o700)
    store = RetainedResults(tmp_path / "results", max_results=3)
    for index in range(4):
        store.keep(bound_log(success(f"e-{index}")))
        _age(_dir(store) / f"e-{index}.json", 100 - index)
    store.files.listing()
    assert _names(store) == ["e-1.json", "e-2.json", "e-3.json"]


def test_the_oldest_go_past_the_bytes(tmp_path: Path) -> None:
    """With room for about two records' bytes, a third leaves two."""
    tmp_path.chmod(0o700)
    size = len(json.dumps(bound_log(success("e-0", response="z" * 5000))))
    store = RetainedResults(tmp_path / "results", max_bytes=int(size * 2.5))
    for index in range(3):
        store.keep(bound_log(success(f"e-{index}", response="z" * 5000)))
        _age(_dir(store) / f"e-{index}.json", 100 - index)
    store.files.listing()
    assert _names(store) == ["e-1.json", "e-2.json"]


def test_temp_files_of_a_crash_go_at_boot_and_only_stale_ones_later(
    store: RetainedResults,
) -> None:
    """At boot every `.tmp.` file is a crashed write's; while serving, one under an hour old
    may be a write in progress."""
    store.keep(bound_log(success("e-1")))
    fresh = _dir(store) / "e-2.json.tmp.aaaa"
    stale = _dir(store) / "e-3.json.tmp.bbbb"
    fresh.write_text("{")
    stale.write_text("{")
    _age(stale, 7200)
    store.files.listing()
    assert fresh.exists()
    assert not stale.exists()
    store.files.sweep()
    assert _names(store) == ["e-1.json"]


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    """A state dir others may write is refused: OSError, and no file appears."""
    (tmp_path / "results").mkdir(mode=0o700)
    tmp_path.chmod(0o700)
    (tmp_path / "results").chmod(0o777)
    store = RetainedResults(tmp_path / "results")
    with pytest.raises(OSError, match="writable by group or others"):
        store.keep(bound_log(success("e-1")))
    assert list((tmp_path / "results").iterdir()) == []


# --- Results: what a turn's settle leads to ------------------------------------------------


def _results(tmp_path: Path, redactor: Redactor | None = None) -> tuple[Results, RetainedResults]:
    store = RetainedResults(tmp_path / "results")
    return Results(store, redactor or Redactor(), Metrics(), callbacks=None), store


def _body(response: str, secret: str = "") -> dict[str, object]:
    return {
        "status": "success",
        "response": response,
        "execution_log": [{"type": "result", "result": secret or response}],
        "session_id": "s-1",
        "metadata": metadata("e-1"),
    }


def test_the_retained_record_is_redacted_and_the_answer_untouched(tmp_path: Path) -> None:
    """A secret the answer still holds is masked in the record; settle changes nothing
    of the body the HTTP answer is built from, and returns before the record exists."""
    secret = "sk-ant-oat01-" + "q" * 40
    redactor = Redactor()
    redactor.add([secret])
    results, store = _results(tmp_path, redactor)
    body = _body(f"the key is {secret}", secret)

    async def scenario() -> bool:
        results.settle("e-1", 200, body, auth_route="baseline", elapsed_ms=5)
        kept_at_once = store.get("e-1") is not None
        await results.close(5.0)
        return kept_at_once

    assert asyncio.run(scenario()) is False
    assert body["response"] == f"the key is {secret}"
    assert secret not in (tmp_path / "results" / "e-1.json").read_text()
    record = store.get("e-1")
    assert record is not None
    assert record["response"] == f"the key is {MASK}"
    assert record["execution_log"] == [{"type": "result", "result": MASK}]


def test_a_settled_answer_is_served_from_memory_until_its_file_lands(tmp_path: Path) -> None:
    """Read your writes: at once the record is the answer's, then the file's, the same."""
    results, _ = _results(tmp_path)

    async def scenario() -> tuple[object, object]:
        results.settle("e-1", 200, _body("first"), auth_route="baseline", elapsed_ms=5)
        in_memory = results.get("e-1")
        await results.close(5.0)
        return in_memory, results.get("e-1")

    in_memory, on_disk = asyncio.run(scenario())
    assert isinstance(in_memory, dict) and isinstance(on_disk, dict)
    assert in_memory == on_disk  # the same record, `truncated_log` and all
    RetainedResult.model_validate(in_memory)
    assert results.unwritten("e-1") is None


def test_an_execution_id_that_is_also_a_secret_still_names_its_record(tmp_path: Path) -> None:
    """A `.env` value equal to an id masks it in the texts, never in the record's name."""
    redactor = Redactor()
    redactor.track_dotenv(["job-4242-abcdef"])
    results, store = _results(tmp_path, redactor)

    async def scenario() -> None:
        results.settle("job-4242-abcdef", 200, _body("ok"), auth_route="baseline", elapsed_ms=1)
        await results.close(5.0)

    asyncio.run(scenario())
    record = store.get("job-4242-abcdef")
    assert record is not None
    assert record["execution_id"] == "job-4242-abcdef"


def test_a_shutdown_that_leaves_a_record_unwritten_says_so_and_counts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing is lost silently: a write the exit overtakes is one WARNING and a count."""
    results, _ = _results(tmp_path)
    (tmp_path / "results").mkdir()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        # The writer thread is busy with something that outlasts the budget.
        blocker = loop.run_in_executor(results._writer, lambda: time.sleep(0.5))
        results.settle("late", 200, _body("ok"), auth_route="baseline", elapsed_ms=1)
        await results.close(0.1)
        await blocker

    asyncio.run(scenario())
    assert results.metrics.retention_failures._value.get() == 1
    assert any(
        r.levelname == "WARNING" and "not retained before exit: late" in r.getMessage()
        for r in caplog.records
    )

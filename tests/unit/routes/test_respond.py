"""The answer gate's event streams: data no reader splits where the server did not."""

from __future__ import annotations

import json

from agent_server.routes.respond import SSE_LINE_BREAKS


def test_no_event_data_holds_a_line_break_of_any_reader() -> None:
    """After SSE_LINE_BREAKS, `str.splitlines` (httpx's reader) finds one line, and a JSON
    line's value is unchanged."""
    breaks = "\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
    line = json.dumps({"text": "a\u2028b\x85c\u2029d"}, ensure_ascii=False) + "\r"
    safe = (breaks + line).translate(SSE_LINE_BREAKS)
    assert safe.splitlines() == [safe]
    assert json.loads(line.translate(SSE_LINE_BREAKS)) == json.loads(line)

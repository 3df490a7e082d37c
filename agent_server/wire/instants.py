"""How the wire writes and reads an instant: ISO 8601 UTC with `Z`, whole seconds.

One rule for both halves: a written instant is rounded up to the next whole second,
so a reset is never early, and a read one must carry its offset (a naive text is
ambiguous and reads as nothing).
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import overload


@overload
def format_instant(instant: datetime) -> str: ...
@overload
def format_instant(instant: None) -> None: ...
def format_instant(instant: datetime | None) -> str | None:
    """ISO-8601 UTC with `Z`, whole seconds, rounded up so a reset is never early."""
    if instant is None:
        return None
    utc = instant.astimezone(UTC)
    if utc.microsecond:
        utc = utc.replace(microsecond=0)
        with contextlib.suppress(OverflowError):  # only at the very end of year 9999
            utc += timedelta(seconds=1)
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S}Z"


def parse_instant(value: object) -> datetime | None:
    """An ISO-8601 instant with its offset (`…Z` too) as an aware datetime, else None.

    A naive text is ambiguous and reads None, as does anything that is not a string.
    """
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo is not None else None

"""What the three fake CLIs share: fingerprints, directives, one event a line, dying.

Standard library only: the fakes run as executables under any Python 3.11+.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any, NoReturn


def fingerprint(value: str) -> str:
    """Return the first 12 hex digits of the sha256 of ``value``."""
    return hashlib.sha256(value.encode()).hexdigest()[:12]


def die(message: str, code: int = 1) -> NoReturn:
    """Print ``message`` on stderr and exit with ``code``, as a CLI refusing its argv."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    sys.exit(code)


def write_event(event: dict[str, Any]) -> None:
    """Print one JSON event on one line and flush, as the real CLIs stream."""
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def directives(prompt: str) -> list[tuple[str, str]]:
    """Return the ``@name arg`` lines of the prompt, in order."""
    found = []
    for raw in prompt.splitlines():
        line = raw.strip()
        if line.startswith("@") and len(line) > 1:
            name, _, arg = line[1:].partition(" ")
            found.append((name, arg.strip()))
    return found

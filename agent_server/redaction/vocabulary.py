"""The server's own vocabulary: the words no secret may be (contract §8).

Every word the server's code spells in a string: its routes, error codes, header
values, the values of its answers, and the event names, keys and markers of the CLIs
it reads. A value found in one of them is no random credential, and masking it would
corrupt the protocol (a `.env` line `X_TOKEN=rate_limit` would hide every
`rate_limit`), so the redactor never holds one.

The words are generated from the sources into `vocabulary.txt` beside this module
(about 20 KB, one a line), checked in and shipped with the package:
`make vocabulary` writes it again, and a unit test fails while it is not current.
Nothing reads source text at run time.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from importlib import resources
from pathlib import Path

VOCABULARY_FILE = "vocabulary.txt"
_LITERAL = re.compile(r"""(["'])((?:(?!\1)[^\\\n]|\\.){3,200}?)\1""")
"""A one-line string literal (a docstring's prose is no protocol)."""
_WORD = re.compile(r"[A-Za-z0-9_./:@-]{3,}")
_NOT_THE_SERVERS = frozenset({"controller", "__pycache__"})
"""The controller library sits beside the server and speaks no protocol of its own."""


@functools.cache
def own_vocabulary() -> str:
    """The generated words, one a line; read once. A package without its vocabulary
    file is broken, and says so at once rather than redact the server's own words."""
    return resources.files(__package__).joinpath(VOCABULARY_FILE).read_text(encoding="utf-8")


def collect(package: Path) -> str:
    """The distinct words of the string literals of the server's sources under
    `package`, one a line, sorted: what `vocabulary.txt` must hold."""
    words: set[str] = set()
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d not in _NOT_THE_SERVERS)
        for name in sorted(files):
            if name.endswith(".py"):
                source = Path(folder, name).read_text(encoding="utf-8")
                for literal in _LITERAL.finditer(source):
                    words.update(_WORD.findall(literal.group(2)))
    return "\n".join(sorted(words)) + "\n"


def package_root() -> Path:
    """The folder of the `agent_server` package whose vocabulary this is."""
    return Path(__file__).resolve().parents[1]


if __name__ == "__main__":  # `make vocabulary`
    target = Path(__file__).with_name(VOCABULARY_FILE)
    target.write_text(collect(package_root()), encoding="utf-8")
    sys.stdout.write(f"wrote {target}\n")

"""`agent-server serve` with other slow-client limits, for tests that cannot wait 30 s.

    python tests/support/limited_server.py HEADER_TIMEOUT_S BODY_TIMEOUT_S MAX_CONNECTIONS \
        SEND_TIMEOUT_S

The product takes no setting for these (contract §8): this script passes them to
`agent_server.__main__.serve` through its one test seam, everything else as served.
`ServerProcess(..., limits=ClientLimits(...))` runs it.
"""

from __future__ import annotations

import sys

from agent_server.__main__ import serve
from agent_server.client_limits import ClientLimits


def main(argv: list[str]) -> int:
    """Serve with the limits named on the command line."""
    header_s, body_s, max_connections, send_s = argv
    return serve(ClientLimits(float(header_s), float(body_s), int(max_connections), float(send_s)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

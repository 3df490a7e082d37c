"""Which credential a turn ran on: exactly the one the server names, or nobody (pure).

The server reports the fingerprint of the credential a spawn ran with
(`metadata.fingerprint`). A failure, a reading or a service is the credential's whose
fingerprint that is: not the one the walk sent (an old server ignores it), and never a
guess such as the assignment. When the fingerprint names no credential of the pool, it
is nobody's.
"""

from __future__ import annotations

from agent_server.controller.pool.file import Pool
from agent_server.controller.pool.rungs import Rung
from agent_server.wire.turns import TurnMetadata


def ran_on(pool: Pool, sent: Rung | None, metadata: TurnMetadata | None) -> Rung | None:
    """The credential the server says it ran: the one its fingerprint names; `sent` when
    the server applied it and names none; None when no credential of the pool is named."""
    said = metadata.fingerprint if metadata is not None else None
    if said is None:
        return sent
    known = pool.by_fingerprint(said)
    if known is None:
        return None
    if sent is not None and known.id == sent.credential_id:
        return sent
    return Rung(known.id, known.kind, "assigned")

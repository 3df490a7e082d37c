"""Every wait of a turn's ending and of the shutdown, named once (contract §8).

A turn that must be stopped costs at most `KILL_BOUND_S`: SIGTERM and the leader's
grace, SIGKILL and the reaping of the group, then reading the pipes to their end and
closing them. Shutdown gives running turns the operator's grace
(`AGENT_SERVER_SHUTDOWN_GRACE_S`), then kills the rest, which all end within
`SHUTDOWN_MARGIN_S`; uvicorn's own deadline is the grace plus that margin, so it
never drops a turn whose 504 is still being written.
"""

from __future__ import annotations

KILL_GRACE_S = 3.0
"""SIGTERM to SIGKILL: how long the CLI may take to exit on its own."""
REAP_TIMEOUT_S = 2.0
"""How long a killed group may take to disappear (its members reaped), and what left
it to be swept, both together."""
REAP_POLL_S = 0.01
ORPHAN_REAP_DELAY_S = 0.05
"""From a SIGCHLD to the scan that collects zombies of adopted orphans (signals in
between share that scan): never in the way of the turn whose CLI just exited."""
LINE_SLICE_S = 0.002
"""How long a turn's stdout lines may hold the event loop at a time: past it, reading
pauses (the CLI waits on its full pipe) and the rest of the chunk goes on at the
loop's next step."""
PIPE_DRAIN_S = 2.0
"""How long to read stdout/stderr to EOF once the group is dead; only a process that
left the group (setsid) can hold them longer, and it must not hang the turn."""
PIPE_CLOSE_S = 2.0
"""How long closing the pipes may take."""
KILL_BOUND_S = KILL_GRACE_S + REAP_TIMEOUT_S + PIPE_DRAIN_S + PIPE_CLOSE_S
"""The most one stopped turn takes from the first signal until its answer is built."""
ANSWER_S = 1.0
"""Room to build and write the answers of the killed turns."""
SHUTDOWN_MARGIN_S = KILL_BOUND_S + ANSWER_S
"""After the grace: every killed turn has answered within this."""
RECORDS_AT_EXIT_S = 3.0
"""After the turns: how long their records may take to reach the disk (and callbacks in
flight to be delivered) before the server exits, what is left logged and counted."""


CALLBACK_LEASE_GRACE_S = 300.0
"""An async turn's result is retried until its timeout plus this after it was accepted:
the lease Trinity's backend holds its slot for."""


STOP_TIMEOUT_MARGIN_S = SHUTDOWN_MARGIN_S + RECORDS_AT_EXIT_S
"""What a container's stop timeout must give beyond the grace (13 s): every turn
answered, its record written; give it more than that."""


def server_shutdown_timeout(grace_s: float) -> float:
    """uvicorn's graceful-shutdown deadline: the grace, then the margin to kill and answer."""
    return grace_s + SHUTDOWN_MARGIN_S

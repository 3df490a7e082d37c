"""The paired controller library: a typed client of agent-server and the pool walk.

    from agent_server.controller import AgentClient, Walker, WalkTurn, load_pool, open_store

Everything a controller uses is named here (`__all__`); the modules behind it are
private by default. The server never imports this package; it talks to a server over
HTTP only, and shares the server's wire leaf (`agent_server.wire`). docs/controller.md
is the guide.

    client.py      AgentClient: every route, typed answers, live events (sse.py)
    errors.py      the one exception tree, and the one mapping of a non-2xx answer
    callbacks.py   signed_by_server: a result callback the server signed, not the agent
    pool/          the pool file or a pool built in code; its state, standing, rungs,
                   waits (when to try again), status
    stores/        the PoolStore protocol, open_store(url): SQLite and Redis
    walker.py      Walker: a fleet's front door (a client each agent); assign by hand
    walk.py        one turn's walk through the ladder; commit.py: the commit by CAS and
                   stabilization; attribution.py: which credential a turn ran on
    readback.py    a finished turn read back from the server: a re-run is safe
    turn.py        WalkTurn, what a walk is asked; result.py: WalkResult, what it did
    retries.py     RetryScheduler: each waiting turn's retry, claimed, run at least once
    events.py      WalkEvent: one event a phase, to a hook and the log
    cli.py         `agent-server pool walk|status|stop|assign|clear`
"""

from agent_server.controller.callbacks import signed_by_server
from agent_server.controller.client import AcceptedReply, AgentClient, TurnReply
from agent_server.controller.clock import Clock, utc_now
from agent_server.controller.errors import (
    AgentError,
    AuthRefused,
    BillingRefused,
    Busy,
    Conflict,
    ControllerError,
    CredentialRefused,
    ExecutionInProgress,
    GenerationMismatch,
    NotFound,
    PoolFileError,
    ProtocolError,
    RateLimited,
    RequestRejected,
    StoreError,
    TransportError,
    TurnFailed,
    Unauthorized,
    UnknownAgent,
)
from agent_server.controller.events import EventHook, WalkEvent, WalkPhase
from agent_server.controller.pool.file import Pool, PoolCredential, build_pool, load_pool
from agent_server.controller.pool.state import (
    Assignment,
    CredentialInfo,
    CredentialKind,
    Failure,
    FailureKind,
    PoolSnapshot,
    Reading,
    ScheduledRetry,
)
from agent_server.controller.pool.status import CredentialRow, pool_rows, pool_status
from agent_server.controller.result import Attempt, WalkOutcome, WalkResult
from agent_server.controller.retries import RetryScheduler, RunRetry
from agent_server.controller.stores.base import PoolStore, default_store_url, open_store
from agent_server.controller.turn import WalkTurn
from agent_server.controller.walker import AgentClients, Walker

__all__ = [
    "AcceptedReply",
    "AgentClient",
    "AgentClients",
    "AgentError",
    "Assignment",
    "Attempt",
    "AuthRefused",
    "BillingRefused",
    "Busy",
    "Clock",
    "Conflict",
    "ControllerError",
    "CredentialInfo",
    "CredentialKind",
    "CredentialRefused",
    "CredentialRow",
    "EventHook",
    "ExecutionInProgress",
    "Failure",
    "FailureKind",
    "GenerationMismatch",
    "NotFound",
    "Pool",
    "PoolCredential",
    "PoolFileError",
    "PoolSnapshot",
    "PoolStore",
    "ProtocolError",
    "RateLimited",
    "Reading",
    "RequestRejected",
    "RetryScheduler",
    "RunRetry",
    "ScheduledRetry",
    "StoreError",
    "TransportError",
    "TurnFailed",
    "TurnReply",
    "Unauthorized",
    "UnknownAgent",
    "WalkEvent",
    "WalkOutcome",
    "WalkPhase",
    "WalkResult",
    "WalkTurn",
    "Walker",
    "build_pool",
    "default_store_url",
    "load_pool",
    "open_store",
    "pool_rows",
    "pool_status",
    "signed_by_server",
    "utc_now",
]

"""The paired controller library: a typed client of agent-server and the pool walk.

The server never imports this package; it talks to a server over HTTP only, and it
shares the server's wire models (`agent_server.models`, `turn_models`, `names`).
docs/controller.md is the guide.

    client.py      AgentClient: every route, typed answers, live events
    errors.py      the one exception tree, and the one mapping of a non-2xx answer
    callbacks.py   signed_by_server: a result callback the server signed, not the agent
    pool_file.py   the pool file (TOML): credentials and where their secrets are
    standing.py    how a credential stands now (pure): throttled, failed recently, headroom
    rungs.py       the ladder a turn may still try (pure)
    walk.py        Walker: runs one turn through the ladder, commits once, waits
    retries.py     RetryScheduler: one retry an agent, armed from the store
    store.py       the PoolStore protocol, open_store(url); sqlite_store.py, redis_store.py
    cli.py         `agent-server pool walk|status`
"""

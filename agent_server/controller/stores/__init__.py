"""Where a controller keeps its pool's state, shared by every worker.

base.py       the PoolStore protocol, and open_store(url)
codec.py      how both stores write a record (instants as integer microseconds)
sqlite.py     SqliteStore: `sqlite:///PATH`, the embedded default
redis.py      RedisStore: `redis://HOST:PORT/DB`, for several workers or hosts
"""

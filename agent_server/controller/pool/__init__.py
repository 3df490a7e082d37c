"""The pool: its credentials, what a store knows of them, and the walk's pure decisions.

file.py       the pool file (TOML), and a pool built in code, with one validation
state.py      what a store keeps: assignments, failures, readings, retries (no secret)
standing.py   how a credential stands now (pure): throttled, failed recently, headroom
rungs.py      the ladder a turn may still try (pure)
status.py     the pool as an operator reads it (`pool status`)
"""

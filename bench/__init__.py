"""Benchmarks of agent-server against a direct spawn and the FastAPI baseline.

`python -m bench [--quick]` runs every figure side by side in one run, prints a table
(figure, measured, target, verdict, baseline) and writes bench/results-latest.json.
One module per figure: timeline (0, where a turn's milliseconds go), turn_overhead
(1), parallel_turns (2), reload_latency (3), memory_startup (4), spawn_env_build (5),
redaction (6), machine_costs (7, what the machine charges any program); server.py
starts and kills real servers, probed_server.py runs one with the timeline's probes,
standin_cli.py is the stand-in Claude Code CLI.
"""

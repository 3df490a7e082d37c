"""Credentials handed to the CLI on a file descriptor, never in its environment (contract §4.7).

A CLI that can read a credential from a descriptor (Claude Code: `…_FILE_DESCRIPTOR=N`)
gets it on a pipe written once and closed, so neither the tools it runs nor another
turn find it in `/proc/<pid>/environ`. `by_descriptor` is the pure split; the runner
makes the pipes.
"""

from __future__ import annotations

from collections.abc import Mapping


def by_descriptor(
    env: Mapping[str, str], descriptors: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """`env` without the credentials named in `descriptors` (variable -> descriptor
    variable), and their values keyed by the descriptor variable that will carry them."""
    if not any(name in env for name in descriptors):
        return dict(env), {}
    # An empty value stays unset, as an empty variable is to the CLI.
    handed = {descriptors[n]: value for n, value in env.items() if n in descriptors and value}
    rest = {name: value for name, value in env.items() if name not in descriptors}
    return rest, handed

#!/usr/bin/env bash
# Container entry point (contract §3, §9): export the rotated token, then become the server.
# The server is exec'd so it is PID 1's successor and receives SIGTERM directly.
set -euo pipefail

state_dir="${AGENT_SERVER_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/agent-server}"
override_file="$state_dir/oauth-token"

# Refuse what the server refuses: a symlink at the target, or a state dir writable by
# group or others (anyone could plant a token there). An empty file exports nothing.
safe_dir() {
    local mode
    mode="$(stat -L -c '%a' -- "$state_dir" 2>/dev/null)" || return 1
    (( (8#$mode & 8#022) == 0 ))
}
if [ -f "$override_file" ] && [ ! -L "$override_file" ] && [ -s "$override_file" ] && safe_dir; then
    CLAUDE_CODE_OAUTH_TOKEN="$(cat -- "$override_file")"
    export CLAUDE_CODE_OAUTH_TOKEN
fi

exec "${AGENT_SERVER_BIN:-agent-server}" serve "$@"

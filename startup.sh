#!/usr/bin/env bash
# Container entry point (contract §3, §9, §10): become the server's own user, export the
# rotated token, then become the server. Each step is an exec, so the server keeps this
# process's PID and receives SIGTERM directly.
set -euo pipefail

# Started as root (the image's default): drop to the server's user, keeping only what
# the server needs to run each turn as the agent's user and to clean up after it (and
# nothing it runs can gain more: no_new_privs), and run this script again as that user.
# Without such a user, as it is.
server_user="${AGENT_SERVER_USER:-agent-server}"
if [ "$(id -u)" = 0 ] && id -u "$server_user" > /dev/null 2>&1; then
    spawn_user="${AGENT_SERVER_SPAWN_USER:-}"
    if [ -z "${spawn_user//[[:space:]]/}" ]; then
        # Same-uid mode would run every turn as the server's user, in its home.
        echo "startup.sh: AGENT_SERVER_SPAWN_USER is empty but the container runs as root:" \
            "for same-uid mode, start it as the agent's user (docker run --user 1000)" >&2
        exit 2
    fi
    HOME="$(getent passwd "$server_user" | cut -d: -f6)"
    USER="$server_user"
    LOGNAME="$server_user"
    export HOME USER LOGNAME
    script="$(realpath -- "$0")"
    cd / # the server's working directory is nothing the agent owns
    caps="-all,+kill,+setgid,+setuid,+setpcap"
    exec setpriv --reuid="$server_user" --regid="$(id -g "$server_user")" --clear-groups \
        --inh-caps="$caps" --ambient-caps="$caps" --bounding-set="$caps" --no-new-privs \
        -- "$script" "$@"
fi

state_dir="${AGENT_SERVER_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/agent-server}"
override_file="$state_dir/oauth-token"

# Refuse what the server refuses: a symlink at the target, or a state dir writable by
# group or others (anyone could plant a token there). An empty file exports nothing.
safe_dir() {
    local mode
    mode="$(stat -L -c '%a' -- "$state_dir" 2>/dev/null)" || return 1
    (( (8#$mode & 8#022) == 0 ))
}
# The file's token as the server takes it (contract §3): at most 4096 bytes and blanks
# around it, trimmed, then 20 to 4096 printable ASCII characters with no blank or NUL;
# anything else is no token (the server refuses that file too, with an ERROR line).
override_token() {
    local LC_ALL=C raw="" size
    size="$(stat -c '%s' -- "$override_file")" || return 1
    (( size <= 4096 + 64 )) || return 1
    IFS= read -r -d '' raw < "$override_file" || true
    (( ${#raw} == size )) || return 1 # it stopped at a NUL byte
    raw="${raw#"${raw%%[![:space:]]*}"}"
    raw="${raw%"${raw##*[![:space:]]}"}"
    [[ $raw =~ ^[!-~]{20,4096}$ ]] || return 1
    printf '%s' "$raw"
}
if [ -f "$override_file" ] && [ ! -L "$override_file" ] && safe_dir \
    && token="$(override_token)"; then
    export CLAUDE_CODE_OAUTH_TOKEN="$token"
fi
unset token

exec "${AGENT_SERVER_BIN:-agent-server}" serve "$@"

#!/usr/bin/env bash
# `make image`: build docker/Dockerfile into $AGENT_IMAGE (default agent-server:dev).
#
# Base images: PYTHON_IMAGE (default python:3.11-slim-bookworm) and NODE_IMAGE (default
# node:22-bookworm-slim), used when present locally or pullable. AGENT_SERVER_BASES
# chooses: `auto` (default) builds equivalents from Debian packages with
# docker/local-base.sh for the ones that cannot be had, `local` always uses those,
# `pull` fails instead.
#
# A TLS CA bundle named by SSL_CERT_FILE, NODE_EXTRA_CA_CERTS or PIP_CERT (the first
# that is a file) goes to npm and pip as the BuildKit secret `ca_bundle`, never into a
# layer. RUN steps use the host's network (--network host): the daemon may have no
# bridge. BuildKit comes from `docker buildx`, or else from a docker client older than
# 23 (Debian bookworm's docker.io), which still has it built in.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
docker=${DOCKER:-docker}
image=${AGENT_IMAGE:-agent-server:dev}
python_image=${PYTHON_IMAGE:-python:3.11-slim-bookworm}
node_image=${NODE_IMAGE:-node:22-bookworm-slim}
bases=${AGENT_SERVER_BASES:-auto}

log() { printf 'build-image: %s\n' "$*" >&2; }

# A BuildKit `build` command: buildx when installed, else an old client's DOCKER_BUILDKIT=1.
build=()
if "$docker" buildx version > /dev/null 2>&1; then
    build=("$docker" buildx build --load)
else
    for client in $(type -aP docker) /usr/bin/docker; do
        version=$("$client" --version 2> /dev/null | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p')
        if [ -n "$version" ] && [ "$version" -lt 23 ]; then
            build=(env DOCKER_BUILDKIT=1 "$client" build)
            break
        fi
    done
fi
if [ "${#build[@]}" -eq 0 ]; then
    log "no BuildKit client: install docker-buildx (or Debian bookworm's docker.io client)"
    exit 1
fi

available() {
    "$docker" image inspect "$1" > /dev/null 2>&1 && return 0
    [ "$bases" = local ] && return 1
    log "pulling $1"
    "$docker" pull --quiet "$1" > /dev/null 2>&1
}

python_ok=false
node_ok=false
if [ "$bases" != local ]; then
    available "$python_image" && python_ok=true
    available "$node_image" && node_ok=true
fi
if ! $python_ok || ! $node_ok; then
    if [ "$bases" = pull ]; then
        log "cannot pull $python_image / $node_image (AGENT_SERVER_BASES=pull)"
        exit 1
    fi
    [ "$bases" = local ] || log "no registry answers for the base images: local bases"
    local_bases=$(bash docker/local-base.sh)
    $python_ok || python_image=$(sed -n 's/^PYTHON_IMAGE=//p' <<< "$local_bases")
    $node_ok || node_image=$(sed -n 's/^NODE_IMAGE=//p' <<< "$local_bases")
fi

secret=()
for bundle in "${SSL_CERT_FILE:-}" "${NODE_EXTRA_CA_CERTS:-}" "${PIP_CERT:-}"; do
    if [ -n "$bundle" ] && [ -f "$bundle" ] && [ -s "$bundle" ]; then
        secret=(--secret "id=ca_bundle,src=$bundle")
        log "CA bundle $bundle goes in as the build secret ca_bundle"
        break
    fi
done

log "building $image from $python_image and $node_image"
started=$(date +%s)
"${build[@]}" --network host --progress plain \
    --build-arg "PYTHON_IMAGE=$python_image" \
    --build-arg "NODE_IMAGE=$node_image" \
    ${secret[@]+"${secret[@]}"} \
    -f docker/Dockerfile -t "$image" .

# The image this build replaced, now untagged, is dead weight.
"$docker" image prune --force --filter label=org.opencontainers.image.title=agent-server \
    > /dev/null 2>&1 || true
size=$("$docker" image inspect --format '{{.Size}}' "$image")
log "built $image in $(($(date +%s) - started)) s: $((size / 1024 / 1024)) MiB"

#!/usr/bin/env bash
# The base images of docker/Dockerfile, built from Debian packages for a machine that
# reaches a Debian mirror but no image registry (air-gapped or proxied networks).
#
#   docker/local-base.sh    prints two lines, PYTHON_IMAGE=<tag> and NODE_IMAGE=<tag>
#
# Python: `debootstrap --variant=minbase bookworm` + python3, python3-venv, passwd and
# ca-certificates, upgraded from bookworm-updates and bookworm-security, then `docker
# import`: the stand-in for python:3.11-slim-bookworm (bookworm's python3 is 3.11).
# Node: the same root file system + Debian's nodejs and npm, for the npm stage only.
#
# Both tags carry the first 12 hex digits of this script's sha256: an edit here builds
# new bases, anything else reuses them. Older bases of this script are removed.
# Needs root, debootstrap and a docker daemon. The mirror is DEBIAN_MIRROR, else the
# host's apt sources, else debootstrap's default; its security archive is
# DEBIAN_SECURITY_MIRROR, else the mirror's sibling `…/debian-security`.
set -euo pipefail

docker=${DOCKER:-docker}
suite=bookworm
repository=agent-server-base
script_hash=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)
python_tag="$repository:python3.11-$suite-$script_hash"
node_tag="$repository:node-$suite-$script_hash"

log() { printf 'local-base: %s\n' "$*" >&2; }

have_image() { "$docker" image inspect "$1" > /dev/null 2>&1; }

if have_image "$python_tag" && have_image "$node_tag"; then
    log "reusing $python_tag and $node_tag"
    printf 'PYTHON_IMAGE=%s\nNODE_IMAGE=%s\n' "$python_tag" "$node_tag"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    log "building the bases needs root (debootstrap, chroot)"
    exit 1
fi
if ! command -v debootstrap > /dev/null; then
    log "debootstrap is missing: apt-get install -y debootstrap"
    exit 1
fi

# The host's Debian mirror: the first `…/debian` URI of its apt sources (one-line and
# deb822 formats), so the bases use the archive this machine is set up for.
host_mirror() {
    local files=()
    [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
    for file in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$file" ] && files+=("$file")
    done
    [ "${#files[@]}" -gt 0 ] || return 0
    grep -hv '^[[:space:]]*#' "${files[@]}" \
        | grep -oE '(https?|file)://[^[:space:]]+/debian/?([[:space:]]|$)' \
        | head -n 1 | tr -d '[:space:]' | sed 's:/*$::'
}

mirror=${DEBIAN_MIRROR:-$(host_mirror)}
work=$(mktemp -d "${TMPDIR:-/var/tmp}/agent-server-base.XXXXXX")
rootfs="$work/rootfs"
cleanup() {
    if mountpoint -q "$rootfs/proc" 2> /dev/null; then umount "$rootfs/proc"; fi
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT

started=$(date +%s)
log "debootstrap --variant=minbase $suite ${mirror:-(the default mirror of debootstrap)}"
# shellcheck disable=SC2086 # an empty mirror means debootstrap's default
debootstrap --variant=minbase "$suite" "$rootfs" $mirror > "$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    exit 1
}
mirror=$(awk '$1 == "deb" { print $2; exit }' "$rootfs/etc/apt/sources.list")
security=${DEBIAN_SECURITY_MIRROR:-}
if [ -z "$security" ] && [ "${mirror%/debian}" != "$mirror" ]; then
    security="${mirror%/debian}/debian-security"
fi
{
    printf 'deb %s %s main\n' "$mirror" "$suite" "$mirror" "$suite-updates"
    if [ -n "$security" ]; then
        printf 'deb %s %s main\n' "$security" "$suite-security"
    else
        log "no security archive known for $mirror: set DEBIAN_SECURITY_MIRROR"
    fi
} > "$rootfs/etc/apt/sources.list"
# Like Debian's slim images: no documentation, manual pages or translations, and no
# recommended packages. Copyright files stay.
cat > "$rootfs/etc/dpkg/dpkg.cfg.d/slim" << 'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat > "$rootfs/etc/apt/apt.conf.d/90slim" << 'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d" # no service starts
chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
mount -t proc proc "$rootfs/proc"

in_root() {
    chroot "$rootfs" /usr/bin/env -i DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

# Install, tidy, and import the root file system as `tag`; extra args are --change lines.
install_and_import() {
    local tag=$1
    shift
    local packages=()
    while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
        packages+=("$1")
        shift
    done
    shift
    log "installing ${packages[*]}"
    cat /etc/resolv.conf > "$rootfs/etc/resolv.conf" # the host's resolver, for apt
    if ! {
        in_root apt-get update -qq \
            && in_root apt-get -y -qq upgrade \
            && in_root apt-get install -y -qq "${packages[@]}"
    } > "$work/apt.log" 2>&1; then
        tail -n 30 "$work/apt.log" >&2
        exit 1
    fi
    in_root apt-get clean
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/apt/* "$rootfs"/var/cache/debconf/*-old
    rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/tmp/*
    find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias \
        -exec rm -rf {} +
    # Docker provides these at run time; nothing of the build host stays in the image.
    : > "$rootfs/etc/resolv.conf"
    printf 'localhost\n' > "$rootfs/etc/hostname"
    log "importing $tag"
    tar -C "$rootfs" --numeric-owner --one-file-system \
        --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* --exclude=./run/* \
        --exclude=./usr/sbin/policy-rc.d -c . \
        | "$docker" import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --change "LABEL org.opencontainers.image.description=\"agent-server local base: Debian $suite ${packages[*]}\"" \
            --change "LABEL agent-server.base-script-sha256=$script_hash" \
            "$@" - "$tag" > /dev/null
}

install_and_import "$python_tag" python3 python3-venv passwd ca-certificates \
    -- --change 'CMD ["python3"]'
install_and_import "$node_tag" nodejs npm -- --change 'CMD ["node"]'

# Bases of an earlier version of this script are dead weight.
"$docker" image ls --format '{{.Repository}}:{{.Tag}}' "$repository" \
    | grep -vxF -e "$python_tag" -e "$node_tag" \
    | xargs -r "$docker" image rm > /dev/null 2>&1 || true

log "built $python_tag and $node_tag in $(($(date +%s) - started)) s"
printf 'PYTHON_IMAGE=%s\nNODE_IMAGE=%s\n' "$python_tag" "$node_tag"

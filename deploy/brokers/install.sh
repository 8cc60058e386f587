#!/usr/bin/env bash
# Installs RabbitMQ 4.0 or 4.3 from Debian's own packages into a minbase
# root of the Debian release that ships it (bookworm, the host, has 3.10.8
# only, and neither newer package installs on it because of libc):
#
#   deploy/brokers/install.sh 4.0          trixie root, rabbitmq-server 4.0.5
#   deploy/brokers/install.sh 4.3          forky root, rabbitmq-server 4.3.6
#   deploy/brokers/install.sh remove 4.3   unmount and delete that root
#
# The root is ${URUTAN_BROKERS_DIR:-/var/lib/urutan-brokers}/<release>.
# Idempotent and cached: a finished root is reused as it is (a second run
# takes a second); a root that debootstrap left half-done is built again;
# debootstrap's .debs are kept in /var/cache/urutan-brokers/<release>.
# Nothing is started: deploy/brokers/node.sh starts nodes.
#
# The host reaches Debian the way its own apt does: the first Debian mirror
# of /etc/apt/sources.list{,.d} and apt's proxy if one is configured.
# URUTAN_BROKERS_MIRROR overrides the mirror (needed where apt names none). Runs as root on a Debian/Ubuntu host with apt.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=install
# shellcheck source=deploy/brokers/lib.sh
source "$HERE/lib.sh"
# shellcheck source=deploy/host.sh
source "$HERE/../host.sh"

usage() {
    echo "usage: deploy/brokers/install.sh [remove] {4.0|4.3}" >&2
    exit 2
}
ACTION=install
[[ ${1:-} == remove ]] && { ACTION=remove; shift; }
(($# == 1)) || usage
VERSION=$1
RELEASE=$(release_of "$VERSION") || usage
ROOT=$(root_of "$VERSION")
need_root
export DEBIAN_FRONTEND=noninteractive

# One install per root at a time (CI may run two scripts at once).
mkdir -p "$BROKERS_DIR"
exec 8>"$BROKERS_DIR/.install-${RELEASE}.lock"
flock -w 1800 8 || die "another install of ${RELEASE} holds ${BROKERS_DIR}/.install-${RELEASE}.lock"


root_pids() {
    local p
    for p in /proc/[0-9]*; do
        [[ "$(readlink "$p/root" 2>/dev/null)" == "$ROOT" ]] && echo "${p#/proc/}"
    done
    return 0
}

# remove_root WHY: deletes the root, never while something runs or is mounted in it.
remove_root() {
    [[ -e "$ROOT" ]] || return 0
    [[ -z "$(root_pids)" ]] ||
        die "processes still run in ${ROOT} (pids $(root_pids | tr '\n' ' ')); stop its nodes first (deploy/brokers/node.sh stop ...)"
    unmount_under "$ROOT" || die "cannot unmount everything under ${ROOT}"
    log "$1: deleting ${ROOT}"
    rm -rf --one-file-system "$ROOT"
    [[ ! -e "$ROOT" ]] || die "could not delete ${ROOT}"
}

if [[ $ACTION == remove ]]; then
    remove_root "remove"
    # The nodes' data lived in the root: forget the nodes too.
    grep -lx "VERSION=${VERSION}" "$BROKERS_DIR"/nodes/*.env 2>/dev/null | xargs -r rm -f
    log "removed ${ROOT} (the .deb cache in /var/cache/urutan-brokers/${RELEASE} is kept)"
    exit 0
fi

# --- how this host reaches Debian -------------------------------------------
MIRROR=${URUTAN_BROKERS_MIRROR:-$(host_apt_uri /debian)}
[[ -n "$MIRROR" ]] || die "no Debian mirror in /etc/apt/sources.list{,.d}: set URUTAN_BROKERS_MIRROR"
MIRROR=${MIRROR%/}
# apt's proxy on the host, if any (debootstrap's wget reads http_proxy).
APT_PROXY=$(apt-config dump 2>/dev/null |
    sed -n 's/^Acquire::http::Proxy "\(.*\)";$/\1/Ip' | head -n 1 || true)
[[ -z "$APT_PROXY" || "$APT_PROXY" == DIRECT ]] && APT_PROXY=${http_proxy:-}
if [[ -n "$APT_PROXY" ]]; then
    export http_proxy=$APT_PROXY
    log "mirror ${MIRROR} through proxy ${APT_PROXY} (as the host's apt)"
else
    log "mirror ${MIRROR}, no proxy (as the host's apt)"
fi

# --- the host's tools ---------------------------------------------------------
SCRIPT=/usr/share/debootstrap/scripts/sid # bookworm's debootstrap knows no forky
host_tools_missing() {
    ! command -v debootstrap >/dev/null 2>&1 || [[ ! -f $SCRIPT ]] ||
        [[ ! -f /usr/share/keyrings/debian-archive-keyring.gpg ]]
}
if host_tools_missing; then
    # Installs of two releases run side by side (deploy/brokers/ci.sh) and
    # would race for apt's own lists lock: one host apt step at a time, and
    # the second finds the tools already there.
    exec 9>"$BROKERS_DIR/.host-apt.lock"
    flock -w 1200 9 || die "another install holds ${BROKERS_DIR}/.host-apt.lock"
    if host_tools_missing; then
        log "installing on the host: debootstrap debian-archive-keyring"
        timeout 600 apt-get update -q >/dev/null || die "apt-get update failed on the host"
        timeout 600 apt-get install -y -q --no-install-recommends debootstrap debian-archive-keyring \
            >/dev/null || die "apt-get install debootstrap failed on the host"
    fi
    exec 9>&-
fi

# --- the root -----------------------------------------------------------------
if installed "$VERSION"; then
    log "${ROOT}: ${RELEASE} root with rabbitmq-server already installed, nothing to build"
else
    if [[ -e "$ROOT" && (! -f "$ROOT/etc/debian_version" || -d "$ROOT/debootstrap") ]]; then
        remove_root "an unfinished debootstrap"
    fi
    if [[ ! -f "$ROOT/etc/debian_version" ]]; then
        cache=/var/cache/urutan-brokers/$RELEASE
        mkdir -p "$cache"
        log "debootstrap --variant=minbase ${RELEASE} ${ROOT} ${MIRROR} (cache ${cache}; a few minutes)"
        start=$SECONDS
        if ! timeout 1800 debootstrap --variant=minbase --cache-dir="$cache" \
            "$RELEASE" "$ROOT" "$MIRROR" "$SCRIPT" >"$BROKERS_DIR/debootstrap-${RELEASE}.log" 2>&1; then
            tail -n 20 "$BROKERS_DIR/debootstrap-${RELEASE}.log" | sed 's/^/    /' >&2
            die "debootstrap ${RELEASE} failed (log ${BROKERS_DIR}/debootstrap-${RELEASE}.log)"
        fi
        log "debootstrap done in $((SECONDS - start))s"
    fi
    # No service may start from a package's postinst: a chroot has no init,
    # and the package's own node would take 5672 on the host's network.
    printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
    chmod 755 "$ROOT/usr/sbin/policy-rc.d"
    {
        # forky's Release file is past its Valid-Until on the mirror.
        echo 'Acquire::Check-Valid-Until "false";'
        [[ -n "$APT_PROXY" ]] && echo "Acquire::http::Proxy \"${APT_PROXY}\";"
        true
    } >"$ROOT/etc/apt/apt.conf.d/80urutan-brokers"
    mount_root "$ROOT"
    log "apt-get install --no-install-recommends rabbitmq-server in ${RELEASE}"
    start=$SECONDS
    in_root "$ROOT" DEBIAN_FRONTEND=noninteractive \
        timeout 900 apt-get -q -o Acquire::Check-Valid-Until=false update >/dev/null ||
        die "apt-get update in ${ROOT} failed"
    in_root "$ROOT" DEBIAN_FRONTEND=noninteractive \
        timeout 1200 apt-get install -y -q --no-install-recommends rabbitmq-server \
        >"$BROKERS_DIR/apt-${RELEASE}.log" 2>&1 || {
        tail -n 20 "$BROKERS_DIR/apt-${RELEASE}.log" | sed 's/^/    /' >&2
        die "apt-get install rabbitmq-server in ${ROOT} failed"
    }
    in_root "$ROOT" apt-get clean
    log "rabbitmq-server installed in $((SECONDS - start))s"
fi

mount_root "$ROOT"
# The package's default node would clash with nodes that node.sh names; it
# is never started (policy-rc.d), and its cookie is the one every node and
# CLI of this root shares.
version=$(in_root "$ROOT" dpkg-query -W -f '${Version}' rabbitmq-server)
erlang=$(in_root "$ROOT" dpkg-query -W -f '${Version}' erlang-base 2>/dev/null || echo unknown)
case $version in
"$VERSION".*) ;;
*) die "${ROOT} has rabbitmq-server ${version}, expected ${VERSION}.x" ;;
esac
log "ready: RabbitMQ ${version} (Erlang ${erlang}) in ${ROOT}; /proc and /dev mounted"

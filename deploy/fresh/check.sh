#!/usr/bin/env bash
# The README's promise, checked on a truly fresh machine: a clean Debian
# bookworm root (debootstrap minbase) with only the Rust toolchain in it runs
# `deploy/local/demo.sh` (set-up, release build, demo and its verification)
# from a fresh clone of the committed tree.
#
#   deploy/fresh/check.sh           set-up, build, demo, set-up after a "reboot"
#   deploy/fresh/check.sh --full    and then deploy/local/test.sh (30+ minutes)
#   deploy/fresh/check.sh --validate-only
#                                   setup.sh, then deploy/validate.sh (its Debian
#                                   and PyPI installs, no Rust build): minutes
#
# Runs as root, on the host (Debian/Ubuntu with apt, iproute2, git, python3).
# The root runs in its own network namespace: its RabbitMQ and PostgreSQL on
# 5672/5432 live on the namespace's own loopback and never meet the host's.
# The namespace has no route out; a small proxy (deploy/fresh/proxy.py) on the
# host's end of a veth pair serves apt (plain HTTP) and cargo/pip (CONNECT).
#
# Every run builds a new root; debootstrap's .debs are cached in
# /var/cache/urutan-fresh/debootstrap. Everything else (namespace, veth, proxy,
# mounts, processes, the root) is removed on exit, pass or fail.
#
# The last line says what passed:
#   fresh: PASS bookworm minbase + rust 1.95.0 (commit abc1234): debootstrap 53s, ...
#   fresh: FAIL at <phase>: <why>
#
# Environment (all optional): FRESH_MIRROR (Debian mirror, default the
# host's own from its apt sources), FRESH_SECURITY_MIRROR (likewise), FRESH_HOST_IP /
# FRESH_NS_IP (default 10.213.0.1 / 10.213.0.2, a /30), FRESH_PROXY_PORT (3128),
# FRESH_WORKDIR (parent of the root, default /var/tmp).
set -euo pipefail

readonly SUITE=bookworm
readonly CACHE=/var/cache/urutan-fresh/debootstrap
readonly HOST_IP=${FRESH_HOST_IP:-10.213.0.1}
readonly NS_IP=${FRESH_NS_IP:-10.213.0.2}
readonly PROXY_PORT=${FRESH_PROXY_PORT:-3128}
readonly NS=urutan-fresh-$$
readonly VETH_HOST=ufh$$ VETH_NS=ufn$$ # interface names: at most 15 characters
# Bounds (seconds) for each phase.
readonly DEBOOTSTRAP_SECS=1200 DEMO_SECS=3600 SETUP_SECS=900 TEST_SECS=7200 STOP_SECS=60

FULL=0
VALIDATE_ONLY=0
for arg in "$@"; do
    case $arg in
    --full) FULL=1 ;;
    --validate-only) VALIDATE_ONLY=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "usage: deploy/fresh/check.sh [--full | --validate-only]" >&2
        exit 2
        ;;
    esac
done

PHASE=start
RESULT=""
log() { printf 'fresh: %s\n' "$*"; }
# fail WHY: the final line names the phase; the EXIT trap prints it.
fail() {
    FAIL_WHY=$*
    exit 1
}
FAIL_WHY=""

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/host.sh
source "$HERE/../host.sh"
# Debian is reached the way the host's apt reaches it.
MIRROR=${FRESH_MIRROR:-$(host_apt_uri /debian)}
SECURITY_MIRROR=${FRESH_SECURITY_MIRROR:-$(host_apt_uri /debian-security)}
readonly MIRROR SECURITY_MIRROR
[[ -n "$MIRROR" && -n "$SECURITY_MIRROR" ]] || {
    echo "fresh: FAIL at start: no Debian (or Debian security) mirror in /etc/apt/sources.list{,.d}: set FRESH_MIRROR and FRESH_SECURITY_MIRROR"
    exit 1
}
[[ $(id -u) -eq 0 ]] || {
    echo "fresh: FAIL at start: run as root (it creates a network namespace, mounts and a chroot)"
    exit 1
}
export PATH="${PATH}:/usr/local/sbin:/usr/sbin:/sbin"
export DEBIAN_FRONTEND=noninteractive

# One check at a time on a machine: they share the veth addresses.
exec 9<"${BASH_SOURCE[0]}"
flock -w 10 9 || {
    echo "fresh: FAIL at start: another deploy/fresh/check.sh is running"
    exit 1
}

WORKDIR=""
ROOT=""
PROXY_PID=""
PROXY_LOG=""
declare -A T=()

in_ns() { ip netns exec "$NS" "$@"; }
# A login-like environment of a new user (root) on the fresh machine, behind
# the proxy.
ROOT_ENV=(
    HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb LANG=C.UTF-8
    PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    http_proxy="http://${HOST_IP}:${PROXY_PORT}" https_proxy="http://${HOST_IP}:${PROXY_PORT}"
    HTTPS_PROXY="http://${HOST_IP}:${PROXY_PORT}" no_proxy=localhost,127.0.0.1,::1
)
# in_root [SECS] CMD...: runs CMD in the root, within SECS seconds (default 600).
in_root() {
    local secs=600
    [[ $1 =~ ^[0-9]+$ ]] && { secs=$1; shift; }
    timeout --kill-after=30 "$secs" ip netns exec "$NS" chroot "$ROOT" /usr/bin/env -i "${ROOT_ENV[@]}" "$@" </dev/null
}

# ---------------------------------------------------------------------------
# cleanup: always, pass or fail
# ---------------------------------------------------------------------------
ns_pids() { ip netns pids "$NS" 2>/dev/null || true; }
root_pids() {
    local p
    [[ -n "$ROOT" ]] || return 0
    for p in /proc/[0-9]*; do
        [[ "$(readlink "$p/root" 2>/dev/null)" == "$ROOT" ]] && echo "${p#/proc/}"
    done
    return 0
}

stop_services() {
    # Graceful first: the services the fresh machine started.
    if [[ -x "$ROOT/usr/sbin/rabbitmqctl" ]] && [[ -n "$(ns_pids)" ]]; then
        timeout "$STOP_SECS" ip netns exec "$NS" chroot "$ROOT" /usr/sbin/rabbitmqctl -q stop \
            >/dev/null 2>&1 || true
    fi
    if [[ -x "$ROOT/usr/bin/pg_lsclusters" ]] && [[ -n "$(ns_pids)" ]]; then
        local ver name
        while read -r ver name _; do
            timeout "$STOP_SECS" ip netns exec "$NS" chroot "$ROOT" \
                pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" stop -m fast \
                >/dev/null 2>&1 || true
        done < <(chroot "$ROOT" pg_lsclusters -h 2>/dev/null || true)
    fi
}

# kill_all: every process in the namespace or the root (epmd and anything
# left), by pid; TERM, then KILL after 10 s.
kill_all() {
    local pids deadline
    pids=$( (ns_pids; root_pids) | sort -u)
    [[ -n "$pids" ]] || return 0
    kill -TERM $pids 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while ((SECONDS < deadline)); do
        pids=$( (ns_pids; root_pids) | sort -u)
        [[ -n "$pids" ]] || return 0
        sleep 0.5
    done
    kill -KILL $pids 2>/dev/null || true
    sleep 1
}


cleanup() {
    local left=()
    set +e
    if [[ -n "$ROOT" ]] && ip netns list 2>/dev/null | grep -qw "$NS"; then
        stop_services
    fi
    kill_all
    if [[ -n "$PROXY_PID" ]]; then
        kill "$PROXY_PID" 2>/dev/null
        wait "$PROXY_PID" 2>/dev/null
    fi
    [[ -n "$ROOT" ]] && { unmount_under "$ROOT" || true; }
    ip netns del "$NS" 2>/dev/null
    ip link del "$VETH_HOST" 2>/dev/null
    # What is left? Never delete the root while anything is mounted in it.
    if [[ -n "$ROOT" ]] && findmnt -rn -o TARGET | grep -qF "$ROOT"; then
        left+=("mounts under $ROOT")
    elif [[ -n "$WORKDIR" ]]; then
        rm -rf --one-file-system "$WORKDIR"
        [[ -e "$WORKDIR" ]] && left+=("$WORKDIR")
    fi
    ip netns list 2>/dev/null | grep -qw "$NS" && left+=("netns $NS")
    ip link show "$VETH_HOST" >/dev/null 2>&1 && left+=("link $VETH_HOST")
    [[ -n "$(root_pids)" ]] && left+=("processes in the root")
    if ((${#left[@]})); then
        log "cleanup: LEFT BEHIND: ${left[*]}"
        return 1
    fi
    log "cleanup: services stopped, proxy stopped, mounts, netns, veth and root removed"
}

finish() {
    local rc=$? clean=0
    trap - EXIT INT TERM
    if ((rc != 0)) && [[ -n "$PROXY_LOG" && -s "$PROXY_LOG" ]]; then
        log "last proxy requests:"
        tail -n 5 "$PROXY_LOG" | sed 's/^/    /'
    fi
    cleanup || clean=1
    if ((rc == 0 && clean == 0)) && [[ -n "$RESULT" ]]; then
        echo "fresh: PASS ${RESULT}"
        exit 0
    fi
    if ((rc == 0)); then
        PHASE=cleanup FAIL_WHY="something was left behind on the host"
    fi
    echo "fresh: FAIL at ${PHASE}${FAIL_WHY:+: ${FAIL_WHY}}"
    exit 1
}
trap finish EXIT
trap 'FAIL_WHY="interrupted"; exit 130' INT TERM

phase() {
    PHASE=$1
    PHASE_START=$SECONDS
    log "== ${PHASE}"
}
phase_done() { T[$PHASE]=$((SECONDS - PHASE_START)); log "${PHASE}: ${T[$PHASE]}s"; }

# ---------------------------------------------------------------------------
# host: what the check itself needs
# ---------------------------------------------------------------------------
phase host
REPO=$(git -C "$HERE" rev-parse --show-toplevel) || fail "$HERE is not in a git checkout"
COMMIT=$(git -C "$REPO" rev-parse HEAD)
if [[ -n "$(git -C "$REPO" status --porcelain --untracked-files=no)" ]]; then
    log "note: ${REPO} has uncommitted changes; the check uses the committed tree ${COMMIT:0:12}"
fi

need=()
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
[[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] || need+=(debian-archive-keyring)
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3 || true)
[[ -n "$PY" ]] || need+=(python3)
if ((${#need[@]})); then
    log "installing on the host: ${need[*]}"
    timeout 600 apt-get update -q >/dev/null || fail "apt-get update failed"
    timeout 600 apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null ||
        fail "apt-get install ${need[*]} failed"
    PY=/usr/bin/python3
fi
ip -o addr show | grep -qF " ${HOST_IP}/" &&
    fail "${HOST_IP} is already in use on this host (set FRESH_HOST_IP / FRESH_NS_IP)"

# The Rust toolchain of the user who runs this (the sudo caller, else root).
user=${SUDO_USER:-root}
home=$(getent passwd "$user" | cut -d: -f6)
RUSTUP_HOME_HOST=${RUSTUP_HOME:-$home/.rustup}
CARGO_HOME_HOST=${CARGO_HOME:-$home/.cargo}
rustup_bin=$CARGO_HOME_HOST/bin/rustup
[[ -x "$rustup_bin" ]] || rustup_bin=$(command -v rustup || true)
[[ -n "$rustup_bin" && -x "$rustup_bin" ]] ||
    fail "no rustup for ${user} (looked in ${CARGO_HOME_HOST}/bin and PATH); install Rust with rustup first"
sysroot=$(cd "$REPO" && RUSTUP_HOME=$RUSTUP_HOME_HOST CARGO_HOME=$CARGO_HOME_HOST \
    "$(dirname "$rustup_bin")/rustc" --print sysroot) || fail "rustc --print sysroot failed"
sysroot=$(readlink -f "$sysroot")
TOOLCHAIN=$(basename "$sysroot")
RUST_VERSION=$("$sysroot/bin/rustc" --version | awk '{ print $2 }')
log "repo ${REPO} at ${COMMIT:0:12}; toolchain ${TOOLCHAIN} (rustc ${RUST_VERSION}) from ${sysroot}"
phase_done

# ---------------------------------------------------------------------------
# debootstrap: a new minbase root every run, .debs cached
# ---------------------------------------------------------------------------
phase debootstrap
mkdir -p "${FRESH_WORKDIR:-/var/tmp}" "$CACHE"
WORKDIR=$(mktemp -d "${FRESH_WORKDIR:-/var/tmp}/urutan-fresh.XXXXXX")
ROOT=$WORKDIR/root
PROXY_LOG=$WORKDIR/proxy.log
log "debootstrap --variant=minbase ${SUITE} ${ROOT} ${MIRROR} (cache ${CACHE})"
if ! timeout "$DEBOOTSTRAP_SECS" debootstrap --variant=minbase --cache-dir="$CACHE" \
    "$SUITE" "$ROOT" "$MIRROR" >"$WORKDIR/debootstrap.log" 2>&1; then
    tail -n 30 "$WORKDIR/debootstrap.log" | sed 's/^/    /'
    [[ -f "$ROOT/debootstrap/debootstrap.log" ]] && tail -n 30 "$ROOT/debootstrap/debootstrap.log" | sed 's/^/    /'
    fail "debootstrap failed"
fi
phase_done

# ---------------------------------------------------------------------------
# the machine: network namespace, proxy, mounts, Rust, the project
# ---------------------------------------------------------------------------
phase prepare
# What a Debian installer writes, and what a machine behind a proxy has.
cat >"$ROOT/etc/apt/sources.list" <<EOF
deb ${MIRROR} ${SUITE} main
deb ${MIRROR} ${SUITE}-updates main
deb ${SECURITY_MIRROR} ${SUITE}-security main
EOF
cat >"$ROOT/etc/apt/apt.conf.d/80proxy" <<EOF
Acquire::http::Proxy "http://${HOST_IP}:${PROXY_PORT}";
Acquire::https::Proxy "http://${HOST_IP}:${PROXY_PORT}";
EOF
cp /etc/hosts /etc/resolv.conf "$ROOT/etc/"
# A network that inspects TLS (as this sandbox's egress does) needs its CA on
# every machine: install the host's local CAs where an administrator would.
# ca-certificates (installed by setup.sh) adds them to the system bundle;
# pip reads that bundle through REQUESTS_CA_BUNDLE.
if compgen -G '/usr/local/share/ca-certificates/*' >/dev/null; then
    mkdir -p "$ROOT/usr/local/share/ca-certificates"
    cp -a /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/"
    ROOT_ENV+=(REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt)
    log "note: copied the host's local CAs into the root: $(cd /usr/local/share/ca-certificates && echo *)"
fi
getent hosts "$(hostname -s)" >/dev/null ||
    log "note: $(hostname -s) does not resolve on the host; RabbitMQ in the root may not start"

ip netns add "$NS"
ip link add "$VETH_HOST" type veth peer name "$VETH_NS"
ip link set "$VETH_NS" netns "$NS"
ip addr add "${HOST_IP}/30" dev "$VETH_HOST"
ip link set "$VETH_HOST" up
in_ns ip addr add "${NS_IP}/30" dev "$VETH_NS"
in_ns ip link set "$VETH_NS" up
in_ns ip link set lo up

"$PY" "$HERE/proxy.py" "$HOST_IP" "$PROXY_PORT" "$PROXY_LOG" &
PROXY_PID=$!
deadline=$((SECONDS + 15))
until in_ns timeout 2 bash -c "exec 3<>/dev/tcp/${HOST_IP}/${PROXY_PORT}" 2>/dev/null; do
    kill -0 "$PROXY_PID" 2>/dev/null || fail "the proxy exited (port ${PROXY_PORT} in use?)"
    ((SECONDS < deadline)) || fail "the proxy on ${HOST_IP}:${PROXY_PORT} is not reachable from the namespace"
    sleep 0.5
done

mount -t proc proc "$ROOT/proc"
mount --bind /dev "$ROOT/dev"
mount --bind /dev/pts "$ROOT/dev/pts"
mount -t tmpfs -o mode=1777,size=512m tmpfs "$ROOT/dev/shm" # PostgreSQL's shared memory
mount --bind /sys "$ROOT/sys"
mount -o remount,bind,ro "$ROOT/sys"

# Rust as rustup installs it: the toolchain (read-only, from the host), the
# rustup binary and its proxies in ~/.cargo/bin, nothing else.
mkdir -p "$ROOT/root/.rustup/toolchains/$TOOLCHAIN" "$ROOT/root/.cargo/bin"
mount --bind "$sysroot" "$ROOT/root/.rustup/toolchains/$TOOLCHAIN"
mount -o remount,bind,ro "$ROOT/root/.rustup/toolchains/$TOOLCHAIN"
cat >"$ROOT/root/.rustup/settings.toml" <<EOF
version = "12"
default_toolchain = "${TOOLCHAIN}"
profile = "minimal"
auto_self_update = "disable"

[overrides]
EOF
cp "$rustup_bin" "$ROOT/root/.cargo/bin/rustup"
for proxy in cargo rustc rustdoc rust-gdb rust-gdbgui rust-lldb rustfmt cargo-fmt cargo-clippy clippy-driver cargo-miri rls rust-analyzer; do
    ln "$ROOT/root/.cargo/bin/rustup" "$ROOT/root/.cargo/bin/$proxy"
done
got=$(in_root rustc --version) || fail "rustc does not run in the root"
log "in the root: ${got}; $(in_root sh -c 'command -v cc gcc python3 pip3 git || true' | tr '\n' ' ')(none of cc/gcc/python3/pip3/git expected)"

# The project as a new user gets it: a clone, at the committed HEAD.
git clone -q --no-local --no-checkout "$REPO" "$ROOT/root/urutan"
git -C "$ROOT/root/urutan" fetch -q "$REPO" "$COMMIT" 2>/dev/null || true
git -C "$ROOT/root/urutan" -c advice.detachedHead=false checkout -q --detach "$COMMIT" ||
    fail "cannot check out ${COMMIT} in the clone"
phase_done

if ((VALIDATE_ONLY)); then
    # As test.sh does: setup.sh first (ca-certificates among others).
    phase setup
    in_root "$SETUP_SECS" bash -c 'cd /root/urutan && exec deploy/local/setup.sh' 2>&1 | grep '^setup:' ||
        fail "deploy/local/setup.sh failed"
    phase_done
    phase validate
    in_root 1800 bash -c 'cd /root/urutan && exec deploy/validate.sh' 2>&1 || fail "deploy/validate.sh failed"
    phase_done
    RESULT="${SUITE} minbase (commit ${COMMIT:0:12}): debootstrap ${T[debootstrap]}s, setup ${T[setup]}s, deploy/validate.sh ok ${T[validate]}s"
    exit 0
fi

# ---------------------------------------------------------------------------
# demo.sh: set-up, release build, demo (phases told apart by their output)
# ---------------------------------------------------------------------------
PHASE=setup
PHASE_START=$SECONDS
log "== deploy/local/demo.sh (set-up, build, demo)"
marks=$WORKDIR/marks
: >"$marks"
set +e
in_root "$DEMO_SECS" bash -c 'cd /root/urutan && exec deploy/local/demo.sh' 2>&1 |
    while IFS= read -r line; do
        printf '%s\n' "$line"
        case $line in
        'setup: ready:'*) echo "setup $SECONDS" >>"$marks" ;;
        *'Finished `release`'*) echo "build $SECONDS" >>"$marks" ;;
        esac
    done
rc=${PIPESTATUS[0]}
set -e
end=$SECONDS
setup_end=$(awk '$1 == "setup" { print $2; exit }' "$marks")
build_end=$(awk '$1 == "build" { print $2; exit }' "$marks")
if [[ -z "$setup_end" ]]; then
    ((rc == 124)) && fail "demo.sh timed out after ${DEMO_SECS}s"
    fail "deploy/local/setup.sh (from demo.sh) did not finish (exit ${rc})"
fi
T[setup]=$((setup_end - PHASE_START))
log "setup: ${T[setup]}s"
PHASE=build
if [[ -z "$build_end" ]]; then
    ((rc == 124)) && fail "demo.sh timed out after ${DEMO_SECS}s"
    fail "cargo build --release (from demo.sh) did not finish (exit ${rc})"
fi
T[build]=$((build_end - setup_end))
log "build: ${T[build]}s"
PHASE=demo
((rc == 0)) || fail "urutan demo exited ${rc}"
T[demo]=$((end - build_end))
log "demo: ${T[demo]}s"

# ---------------------------------------------------------------------------
# re-runs of setup.sh: nothing to do (quick), and after a "reboot"
# ---------------------------------------------------------------------------
phase rerun
out=$(in_root "$SETUP_SECS" bash /root/urutan/deploy/local/setup.sh 2>&1) || {
    printf '%s\n' "$out" | sed 's/^/    /'
    fail "setup.sh failed when everything was already up"
}
printf '%s\n' "$out" | sed 's/^/    /'
grep -q '^setup: ready:' <<<"$out" || fail "setup.sh did not say ready"
phase_done

phase reboot
# What a reboot does to services started without systemd: every process is
# gone and /run is empty again.
stop_services
kill_all
[[ -z "$( (ns_pids; root_pids) | sort -u)" ]] || fail "processes survived the simulated reboot"
rm -rf "$ROOT/run/postgresql" "$ROOT/run/rabbitmq"
log "services stopped, /run/postgresql and /run/rabbitmq removed; running setup.sh again"
PHASE_START=$SECONDS
out=$(in_root "$SETUP_SECS" bash /root/urutan/deploy/local/setup.sh 2>&1) || {
    printf '%s\n' "$out" | sed 's/^/    /'
    fail "setup.sh failed after the reboot"
}
printf '%s\n' "$out" | sed 's/^/    /'
grep -q '^setup: ready:' <<<"$out" || fail "setup.sh did not say ready after the reboot"
in_root pg_isready -q -h 127.0.0.1 -p 5432 -t 5 || fail "PostgreSQL is not up after setup.sh"
in_root 30 rabbitmqctl -q status >/dev/null 2>&1 || fail "RabbitMQ is not up after setup.sh"
phase_done

# ---------------------------------------------------------------------------
# --full: the whole test suite
# ---------------------------------------------------------------------------
test_summary=""
if ((FULL)); then
    phase test
    set +e
    in_root "$TEST_SECS" bash -c 'cd /root/urutan && exec deploy/local/test.sh' 2>&1 |
        tee "$WORKDIR/test.log"
    rc=${PIPESTATUS[0]}
    set -e
    test_summary=$(grep -E '^test: [0-9]+ passed' "$WORKDIR/test.log" | tail -n 1 || true)
    ((rc != 124)) || fail "test.sh timed out after ${TEST_SECS}s"
    ((rc == 0)) || fail "test.sh exited ${rc}${test_summary:+ (${test_summary#test: })}"
    phase_done
fi

requests=$(grep -cE ' (CONNECT|GET|HEAD) ' "$PROXY_LOG" || true)
log "proxy: ${requests} requests served"
RESULT="${SUITE} minbase + rust ${RUST_VERSION} (commit ${COMMIT:0:12}): debootstrap ${T[debootstrap]}s, setup ${T[setup]}s, build ${T[build]}s, demo ok ${T[demo]}s, setup re-run ${T[rerun]}s, after reboot ${T[reboot]}s"
if ((FULL)); then
    RESULT+=", test.sh ${T[test]}s (${test_summary#test: })"
fi

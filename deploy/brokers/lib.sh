# Shared by the scripts in deploy/brokers/ (sourced, not run): where the
# RabbitMQ roots and nodes live, and how to run a command inside a root.
#
# Environment (optional): URUTAN_BROKERS_DIR (default /var/lib/urutan-brokers)
# holds one debootstrap root per Debian release and nodes/<name>.env, the
# record of each node started by node.sh.

BROKERS_DIR=${URUTAN_BROKERS_DIR:-/var/lib/urutan-brokers}
export PATH="${PATH}:/usr/local/sbin:/usr/sbin:/sbin"

# The RabbitMQ of each supported 4.x series: Debian's own package of the
# release that ships it. bookworm (the host) ships 3.10.8 only.
release_of() {
    case $1 in
    4.0) echo trixie ;; # rabbitmq-server 4.0.5, Erlang 27 (Mnesia metadata store)
    4.3) echo forky ;;  # rabbitmq-server 4.3.6, Erlang 29 (Khepri metadata store)
    *) return 1 ;;
    esac
}

root_of() { echo "${BROKERS_DIR}/$(release_of "$1")"; }

die() {
    printf '%s: error: %s\n' "${LOG_TAG:-brokers}" "$*" >&2
    exit 1
}
log() { printf '%s: %s\n' "${LOG_TAG:-brokers}" "$*"; }

# print_help SCRIPT: the script's header comment (up to `set -euo`), then exit 0.
print_help() {
    sed -n '2,/^set -euo/p' "$1" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
}

need_root() {
    [[ $(id -u) -eq 0 ]] || die "run as root (debootstrap, mounts, chroot)"
}

# A clean environment inside a root: nothing of the caller's leaks in.
ROOT_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    HOME=/root LANG=C.UTF-8 LC_ALL=C.UTF-8 ERL_EPMD_ADDRESS=127.0.0.1)

# in_root ROOT CMD...: runs CMD chrooted in ROOT with a clean environment
# (extra VAR=value words may precede CMD).
in_root() {
    local root=$1
    shift
    chroot "$root" /usr/bin/env -i "${ROOT_ENV[@]}" "$@"
}

# mount_root ROOT: /proc and /dev inside the root (RabbitMQ needs both),
# /etc/hosts and /etc/resolv.conf from the host (without /etc/hosts the node
# dies with `epmd_error ... nxdomain`). Idempotent.
mount_root() {
    local root=$1
    cmp -s /etc/hosts "$root/etc/hosts" || cp /etc/hosts "$root/etc/hosts"
    cmp -s /etc/resolv.conf "$root/etc/resolv.conf" || cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
    mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
}

# installed VERSION: the root exists, finished debootstrap and has rabbitmq-server.
installed() {
    local root
    root=$(root_of "$1")
    [[ -f "$root/etc/debian_version" && ! -d "$root/debootstrap" &&
        -x "$root/usr/sbin/rabbitmq-server" ]]
}

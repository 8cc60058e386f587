# Shared by deploy/brokers/install.sh, deploy/fresh/check.sh and the
# deploy/validate*.sh checks (sourced, not run): what they need to know of,
# and do on, the host.

# host_apt_uri SUFFIX: the first URI of the host's own apt sources
# (/etc/apt/sources.list{,.d}, deb822 first) whose path ends in SUFFIX
# (`/debian`, `/debian-security`); empty if there is none. The scripts reach
# Debian the way the machine's apt does, and name no mirror themselves.
host_apt_uri() {
    local suffix=$1 uri
    uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }' |
        grep -E "${suffix}/?\$" | head -n 1 || true)
    [[ -n "$uri" ]] || uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i; break } }' |
        grep -E "${suffix}/?\$" | head -n 1 || true)
    echo "${uri%/}"
}

# unmount_under DIR: unmounts DIR and everything mounted below it, deepest
# first (lazily where busy); fails if something is still mounted there.
unmount_under() {
    local dir=$1 m i mounts
    for i in 1 2 3; do
        mapfile -t mounts < <(findmnt -rn -o TARGET | awk -v d="$dir" '$0 == d || index($0, d "/") == 1' | sort -r)
        ((${#mounts[@]} > 0)) || return 0
        for m in "${mounts[@]}"; do
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
        done
    done
    ! findmnt -rn -o TARGET | awk -v d="$dir" '$0 == d || index($0, d "/") == 1' | grep -q .
}

# as_root CMD...: runs CMD as root (directly, or through sudo).
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -- "$@"
    else
        echo "need root to run: $*" >&2
        return 1
    fi
}

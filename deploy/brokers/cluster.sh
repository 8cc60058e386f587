#!/usr/bin/env bash
# A three-node RabbitMQ 4.3 cluster on this machine (nodes of deploy/brokers/
# node.sh in one forky root, joined with join_cluster), and the faults a
# cluster check injects into it.
#
#   cluster.sh start              install 4.3 if needed, start the nodes that
#                                 are down, join those not in the cluster, wait
#                                 until all three run (idempotent, ~20 s cold)
#   cluster.sh stop               stop all three (graceful)
#   cluster.sh status             each node, and the running nodes as c1 sees them
#   cluster.sh urls [VHOST]       AMQP_URL naming all three nodes, comma-separated
#   cluster.sh leaders [VHOST]    quorum queues: name, leader, members (default vhost /)
#   cluster.sh busiest VHOST      the node that leads most shard queues of VHOST
#   cluster.sh kill NODE          SIGKILL of its VM (NODE: c1, c2, c3 or a full name)
#   cluster.sh restart NODE       start one node again (after kill or stop) and wait
#   cluster.sh rolling            restart the nodes one by one, each only once no
#                                 quorum queue depends on it (quorum critical check),
#                                 drained first and revived after (rabbitmq-upgrade)
#   cluster.sh freeze NODE SECS   SIGSTOP, SECS seconds, SIGCONT
#   cluster.sh partition NODE SECS
#                                 NODE cut off from the other two for SECS seconds,
#                                 then healed (see cmd_partition)
#   cluster.sh full-restart       stop all three, start all three, wait
#   cluster.sh forget             stop and delete all three nodes' data
#   cluster.sh ctl ARGS...        rabbitmqctl on the first running node
#
# Nodes urutan-c1, urutan-c2, urutan-c3 @localhost; AMQP ports 5681-5683
# (CLUSTER_PORT_BASE, default 5680, + 1..3), distribution ports + 20000.
# Every step prints what it does. Runs as root.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=cluster
# shellcheck source=deploy/brokers/lib.sh
source "$HERE/lib.sh"

readonly VERSION=4.3
readonly PORT_BASE=${CLUSTER_PORT_BASE:-5680}
readonly NODES=(urutan-c1 urutan-c2 urutan-c3)
readonly WAIT_SECS=${CLUSTER_WAIT_SECS:-180}

node() { bash "$HERE/node.sh" "$@"; }
port_of() { echo $((PORT_BASE + ${1#urutan-c})); }

# full NODE: urutan-cN from cN, N or urutan-cN (also with @localhost).
full() {
    local n=${1%@localhost}
    n=${n#urutan-}
    n=${n#c}
    [[ $n =~ ^[1-3]$ ]] || die "no such cluster node '$1' (c1, c2, c3)"
    echo "urutan-c$n"
}

running() { node pid "$1" >/dev/null 2>&1; }

# A node that answers, to ask about the cluster.
any_node() {
    local n
    for n in "${NODES[@]}"; do
        if running "$n" && timeout 20 bash "$HERE/node.sh" ctl "$n" -q ping >/dev/null 2>&1; then
            echo "$n"
            return 0
        fi
    done
    return 1
}

ctl() {
    local n
    n=$(any_node) || die "no cluster node answers"
    node ctl "$n" "$@"
}

# running_nodes AS: the cluster's running nodes as node AS sees them, one a line.
running_nodes() {
    timeout 30 bash "$HERE/node.sh" ctl "$1" -q cluster_status --formatter json 2>/dev/null |
        python3 -c 'import json, sys; print("\n".join(json.load(sys.stdin).get("running_nodes", [])))'
}

in_cluster() { running_nodes "$2" | grep -qx "$1@localhost"; }

wait_all_running() {
    local deadline=$((SECONDS + WAIT_SECS)) seen
    while :; do
        seen=$(running_nodes "${NODES[0]}" 2>/dev/null | grep -c '^urutan-c' || true)
        ((seen == 3)) && break
        ((SECONDS < deadline)) || die "the cluster has ${seen} of 3 nodes running after ${WAIT_SECS}s"
        sleep 2
    done
    log "all three nodes run in one cluster"
}

cmd_start() {
    local n first=${NODES[0]} started=()
    bash "$HERE/install.sh" "$VERSION"
    for n in "${NODES[@]}"; do
        if ! running "$n"; then
            node launch "$VERSION" "$n" "$(port_of "$n")"
            started+=("$n")
        fi
    done
    # Nodes that were clustered before wait for each other to boot: wait
    # for all of them only once all were launched.
    for n in "${started[@]}"; do node wait "$n" "$WAIT_SECS"; done
    for n in "${NODES[@]:1}"; do
        if in_cluster "$n" "$first"; then
            continue
        fi
        log "joining ${n}@localhost to ${first}@localhost (stop_app, reset, join_cluster, start_app)"
        node ctl "$n" -q stop_app
        node ctl "$n" -q reset
        node ctl "$n" -q join_cluster "${first}@localhost"
        node ctl "$n" -q start_app
    done
    wait_all_running
}

cmd_stop() {
    local n
    # The last to stop is the first to start: c1, which the others joined.
    for n in "${NODES[2]}" "${NODES[1]}" "${NODES[0]}"; do node stop "$n"; done
}

cmd_status() {
    local n
    node status "${NODES[@]}" 2>/dev/null || true
    if n=$(any_node); then
        echo "running in the cluster (as ${n} sees it): $(running_nodes "$n" | tr '\n' ' ')"
    else
        echo "no cluster node answers"
    fi
}

cmd_urls() {
    local vhost=${1:-} n urls=()
    for n in "${NODES[@]}"; do
        urls+=("amqp://guest:guest@127.0.0.1:$(port_of "$n")${vhost:+/${vhost//\//%2f}}")
    done
    (
        IFS=,
        echo "${urls[*]}"
    )
}

cmd_leaders() {
    ctl -q list_queues -p "${1:-/}" name type leader members
}

cmd_busiest() {
    local vhost=$1
    ctl -q list_queues -p "$vhost" name leader |
        awk '$1 ~ /\.shard-[0-9][0-9][0-9]$/ { n[$2]++ } END { for (l in n) print n[l], l }' |
        sort -rn | head -n 1 | awk '{ print $2 }' | sed 's/@localhost$//'
}

# wait_not_quorum_critical NODE: until stopping NODE would leave every quorum
# queue with a majority of its members (bounded).
wait_not_quorum_critical() {
    local n=$1 deadline=$((SECONDS + WAIT_SECS))
    until timeout 60 bash "$HERE/node.sh" queues "$n" -q check_if_node_is_quorum_critical >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "${n}: still quorum critical after ${WAIT_SECS}s (quorum queues lack members elsewhere)"
        # Each check is a CLI run, an Erlang VM of its own (~1 s of CPU):
        # polled every second they took a core from the nodes and the fleet.
        sleep 3
    done
}

cmd_restart() {
    local n
    n=$(full "$1")
    node launch "$VERSION" "$n" "$(port_of "$n")"
    node wait "$n" "$WAIT_SECS"
    wait_all_running
}

# The procedure of RabbitMQ's upgrade guide, node by node: drain (maintenance
# mode: its clients are disconnected, its quorum queue leaders moved away),
# stop, start, revive.
cmd_rolling() {
    local n t
    for n in "${NODES[@]}"; do
        t=$SECONDS
        wait_not_quorum_critical "$n"
        log "rolling restart: ${n}@localhost (drain, stop, start, revive)"
        timeout 120 bash "$HERE/node.sh" upgrade "$n" -q drain >/dev/null ||
            die "${n}: rabbitmq-upgrade drain failed"
        node stop "$n"
        cmd_restart "$n"
        timeout 120 bash "$HERE/node.sh" upgrade "$n" -q revive >/dev/null ||
            die "${n}: rabbitmq-upgrade revive failed"
        log "rolling restart: ${n}@localhost back in $((SECONDS - t))s"
    done
}

cmd_freeze() {
    local n secs=$2
    n=$(full "$1")
    [[ $secs =~ ^[0-9]+$ ]] || die "freeze NODE SECS"
    node freeze "$n"
    sleep "$secs"
    node thaw "$n"
}

# erl_others NODE: the other two nodes, as an Erlang list of node names.
erl_others() {
    local o list=()
    for o in "${NODES[@]}"; do
        [[ $o == "$1" ]] || list+=("'${o}@localhost'")
    done
    (
        IFS=,
        echo "[${list[*]}]"
    )
}

# A network partition between NODE and the other two, made in the Erlang
# distribution: this machine has no packet filter (no iptables or nft) and
# the nodes share one network namespace, so NODE is given a wrong cookie for
# the two others and disconnected from them. Every connection between them
# is then refused both ways (each side checks the other's cookie), exactly
# as across a cut link, while clients still reach all three nodes (the
# clients of a partitioned node keep their links, as when only the links
# between racks fail) and the CLI tools still reach NODE. Healing gives the
# cookie back and reconnects. RabbitMQ's default partition handling
# (`ignore`) keeps NODE running; quorum queues elect leaders in the majority.
partition_eval() {
    timeout 60 bash "$HERE/node.sh" ctl "$1" -q eval "$2" >/dev/null
}

# partition_heal NODE OTHERS: NODE's own cookie for OTHERS again, reconnected.
partition_heal() {
    partition_eval "$1" "Os = $2, C = erlang:get_cookie(), [erlang:set_cookie(O, C) || O <- Os],
        [net_kernel:connect_node(O) || O <- Os], ok."
}

cmd_partition() {
    local n secs=$2 others
    n=$(full "$1")
    [[ $secs =~ ^[0-9]+$ ]] || die "partition NODE SECS"
    others=$(erl_others "$n")
    log "partition: ${n}@localhost cut off from ${others} for ${secs}s"
    # Healed whatever happens next, so a failed step never leaves it cut.
    trap 'partition_heal "$n" "$others" || true' EXIT
    partition_eval "$n" "Os = ${others}, [erlang:set_cookie(O, urutan_partitioned) || O <- Os],
        [erlang:disconnect_node(O) || O <- Os], ok." || die "${n}: could not cut the distribution links"
    sleep "$secs"
    partition_heal "$n" "$others" || die "${n}: could not heal the partition"
    trap - EXIT
    wait_all_running
    log "partition: ${n}@localhost healed"
}

cmd_full_restart() {
    local n t=$SECONDS
    cmd_stop
    log "full stop done in $((SECONDS - t))s; starting all three"
    for n in "${NODES[@]}"; do node launch "$VERSION" "$n" "$(port_of "$n")"; done
    for n in "${NODES[@]}"; do node wait "$n" "$WAIT_SECS"; done
    wait_all_running
    log "full restart done in $((SECONDS - t))s"
}

cmd=${1:-}
shift || true
case $cmd in
start) need_root && cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
urls) cmd_urls "$@" ;;
leaders) cmd_leaders "$@" ;;
busiest)
    (($# == 1)) || die "busiest VHOST"
    cmd_busiest "$1"
    ;;
kill)
    (($# == 1)) || die "kill NODE"
    node kill "$(full "$1")"
    ;;
restart)
    (($# == 1)) || die "restart NODE"
    cmd_restart "$1"
    ;;
rolling) cmd_rolling ;;
freeze)
    (($# == 2)) || die "freeze NODE SECS"
    cmd_freeze "$@"
    ;;
partition)
    (($# == 2)) || die "partition NODE SECS"
    cmd_partition "$@"
    ;;
full-restart) cmd_full_restart ;;
forget)
    for n in "${NODES[@]}"; do
        [[ -f "$BROKERS_DIR/nodes/${n}.env" ]] && node forget "$n"
    done
    true
    ;;
ctl) ctl "$@" ;;
*)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac

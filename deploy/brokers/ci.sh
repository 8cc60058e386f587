#!/usr/bin/env bash
# What CI runs beyond the machine's RabbitMQ 3.10 (deploy/local/test.sh):
# the broker matrix's CI selection on RabbitMQ 4.0 and 4.3 side by side
# (deploy/brokers/matrix.sh --ci, each version on its own node and private
# PostgreSQL cluster, one test at a time per version: two at once in all,
# as in the machine's own run), then the three-node
# 4.3 cluster under node loss (deploy/brokers/cluster-check.sh).
#
#   deploy/brokers/ci.sh
#
# Installs what is missing (debootstrap roots of Debian trixie and forky,
# Debian's rabbitmq-server in each), starts and stops its own nodes, and
# never touches the machine's broker or its PostgreSQL cluster. The last
# line sums up:
#   brokers: PASS matrix 4.0 (..s), 4.3 (..s); cluster (..s); 812s
#   brokers: FAIL ...
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=brokers
# shellcheck source=deploy/brokers/lib.sh
source "$HERE/lib.sh"
cd "$HERE/../.."
need_root

start=$SECONDS
LOGDIR=$(mktemp -d /tmp/urutan-brokers-ci.XXXXXX)
log "logs in ${LOGDIR}"

# The test binaries once, before the two runs race for cargo's lock.
cargo test --test it --test faults --no-run >"$LOGDIR/build.log" 2>&1 || {
    tail -n 30 "$LOGDIR/build.log" >&2
    die "the test build failed (${LOGDIR}/build.log)"
}

declare -A PG_PORT=([4.0]=5439 [4.3]=5440)
declare -A PID
for v in 4.0 4.3; do
    MATRIX_PG_PORT=${PG_PORT[$v]} MATRIX_PG_CLUSTER=urutan-matrix-${v/./} MATRIX_TEST_THREADS=1 \
        bash "$HERE/matrix.sh" --ci "$v" >"$LOGDIR/matrix-$v.log" 2>&1 &
    PID[$v]=$!
done
failed=()
summary=()
for v in 4.0 4.3; do
    rc=0
    wait "${PID[$v]}" || rc=$?
    last=$(grep -E '^matrix: (PASS|FAIL)' "$LOGDIR/matrix-$v.log" | tail -n 1)
    [[ -n $last ]] || last="matrix: FAIL ${v}: no summary (see ${LOGDIR}/matrix-${v}.log)"
    log "matrix ${v}: ${last}"
    summary+=("${last#matrix: }")
    if ((rc != 0)); then
        failed+=("matrix $v")
        grep -E '^matrix: .*FAILED' "$LOGDIR/matrix-$v.log" >&2 || tail -n 30 "$LOGDIR/matrix-$v.log" >&2
    fi
done
log "matrix: $((SECONDS - start))s"

if ((${#failed[@]})); then
    echo "brokers: FAIL ${failed[*]} (logs in ${LOGDIR}): $(
        IFS=';'
        echo "${summary[*]}"
    )"
    exit 1
fi
echo "brokers: PASS $(
    IFS=';'
    echo "${summary[*]}"
); $((SECONDS - start))s"
rm -rf "$LOGDIR"

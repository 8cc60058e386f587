#!/usr/bin/env bash
# Least-privilege RabbitMQ users for urutan (see README.md next to this file).
#
#   VHOST=/ PREFIX=pesanan \
#   TOPOLOGY_USER=urutan-topology TOPOLOGY_PASSWORD='...' \
#   WORKER_USER=urutan-worker     WORKER_PASSWORD='...' \
#   RELAY_USER=urutan-relay       RELAY_PASSWORD='...' \
#   OPERATOR_USER=urutan-operator OPERATOR_PASSWORD='...' \
#   ./least-privilege.sh
#
# Creates (or updates) up to four users in VHOST (created if missing):
#   topology  configure/write/read on the topology's own objects only;
#             runs `urutan topology`
#   worker    configure nothing, write only `amq.default` (epoch markers
#             into shard queues), read only the shard queues; runs `urutan run`
#   relay     configure nothing, write only the entry exchange and
#             `amq.default`, read nothing; runs `urutan relay` (optional: set
#             RELAY_PASSWORD to create it)
#   operator  configure nothing, write the entry exchange and `amq.default`,
#             read only the DLQ; runs `urutan dlq` (optional: set
#             OPERATOR_PASSWORD to create it)
#
# Passwords come from the environment and reach rabbitmqctl on stdin, never
# on a command line (the process list). Re-running it is safe: existing users
# get the given password and the permissions below, nothing else changes.
# Needs rabbitmqctl with access to the node (run it where RabbitMQ runs, or
# set RABBITMQCTL="rabbitmqctl -n rabbit@host"). RabbitMQ 3.10+. On 4.x
# (Erlang 26+) rabbitmqctl reads a password from stdin only when `add_user`
# gets nothing but the user name (its wrapper counts arguments): there, name
# the node with RABBITMQ_NODENAME=rabbit@host in the environment, not `-n`.

set -euo pipefail

VHOST="${VHOST:-/}"
PREFIX="${PREFIX:-pesanan}"
TOPOLOGY_USER="${TOPOLOGY_USER:-urutan-topology}"
WORKER_USER="${WORKER_USER:-urutan-worker}"
RELAY_USER="${RELAY_USER:-urutan-relay}"
OPERATOR_USER="${OPERATOR_USER:-urutan-operator}"
RABBITMQCTL="${RABBITMQCTL:-rabbitmqctl}"

die() {
    echo "least-privilege.sh: $*" >&2
    exit 2
}

# The same rule as urutan's TOPOLOGY_PREFIX; '.' is the only regex
# metacharacter it allows, so escaping dots quotes it.
case "$PREFIX" in
    '' | *[!A-Za-z0-9._-]*) die "PREFIX must be 1-200 characters of [A-Za-z0-9._-]" ;;
esac
[ "${#PREFIX}" -le 200 ] || die "PREFIX must be at most 200 characters"
[ -n "${TOPOLOGY_PASSWORD:-}" ] || die "set TOPOLOGY_PASSWORD"
[ -n "${WORKER_PASSWORD:-}" ] || die "set WORKER_PASSWORD"

P="${PREFIX//./\\.}"

# RabbitMQ permissions are regular expressions matched against object names
# (`^$` matches nothing). What `urutan topology` touches, each part verified
# against RabbitMQ 3.10 (taking any one away makes it fail with 403):
#   configure  declare: the entry, hash and dead-letter exchanges, the DLQ,
#              the shard queues and the restart sentinel (`<prefix>.alive`);
#   write      be the destination of a binding (hash exchange, DLQ, shard
#              queues) and the x-dead-letter-exchange a queue names (DLX);
#              the entry exchange is only ever a source: not needed;
#              and amq.default: `urutan topology` opens an epoch, putting a
#              marker into every shard queue through the default exchange;
#   read       be the source of a binding (entry, hash, dead-letter
#              exchanges) and own a queue that names a dead-letter exchange
#              (shard queues); the DLQ names none: not needed.
TOPOLOGY_CONFIGURE="^${P}(-hash|\\.dlx|\\.dlq|\\.shard-\\d{3}|\\.alive)?\$"
TOPOLOGY_WRITE="^(${P}(-hash|\\.dlx|\\.dlq|\\.shard-\\d{3})|amq\\.default)\$"
TOPOLOGY_READ="^${P}(-hash|\\.dlx|\\.shard-\\d{3})?\$"
SHARD_QUEUES="^${P}\\.shard-\\d{3}\$"
SENTINEL="^${P}\\.alive\$"
DEAD_LETTER_QUEUE="^${P}\\.dlq\$"
DEFAULT_EXCHANGE='^amq\.default$'
NOTHING='^$'

ctl() {
    # shellcheck disable=SC2086 # RABBITMQCTL may carry options
    $RABBITMQCTL "$@"
}

ensure_vhost() {
    if ! ctl -s list_vhosts name | grep -Fxq -- "$VHOST"; then
        ctl -q add_vhost "$VHOST"
        echo "created vhost $VHOST"
    fi
}

user_exists() { ctl -s list_users | cut -f1 | grep -Fxq -- "$1"; }

# ensure_user NAME PASSWORD: creates the user, or sets its password. No
# `-q` before add_user/change_password: with one more argument, rabbitmqctl
# 4.x reads no stdin and creates no user (and still exits 0).
ensure_user() {
    local name="$1" password="$2"
    if user_exists "$name"; then
        printf '%s' "$password" | ctl change_password "$name" >/dev/null
        echo "updated the password of $name"
    else
        printf '%s' "$password" | ctl add_user "$name" >/dev/null
        user_exists "$name" ||
            die "rabbitmqctl add_user $name did not create the user (on RabbitMQ 4.x, give the node with RABBITMQ_NODENAME, not RABBITMQCTL options)"
        echo "created user $name"
    fi
}

# grant NAME CONFIGURE WRITE READ
grant() {
    ctl -q set_permissions -p "$VHOST" "$1" "$2" "$3" "$4"
    printf 'granted %-20s configure %-36s write %-28s read %s\n' "$1" "'$2'" "'$3'" "'$4'"
}

ensure_vhost

ensure_user "$TOPOLOGY_USER" "$TOPOLOGY_PASSWORD"
grant "$TOPOLOGY_USER" "$TOPOLOGY_CONFIGURE" "$TOPOLOGY_WRITE" "$TOPOLOGY_READ"

ensure_user "$WORKER_USER" "$WORKER_PASSWORD"
# configure the restart sentinel only: the pool re-declares it after a
# broker restart (without it every reconnect counts as a restart: safe, but
# messages that skip a version wait for an epoch each time); write
# amq.default: epoch markers go straight into shard queues through the
# default exchange; read: consume the shard queues. Acks and rejects need no
# permission, and the broker dead-letters on its own.
grant "$WORKER_USER" "$SENTINEL" "$DEFAULT_EXCHANGE" "$SHARD_QUEUES"

if [ -n "${RELAY_PASSWORD:-}" ]; then
    ensure_user "$RELAY_USER" "$RELAY_PASSWORD"
    # write: publish outbox rows to the entry exchange, and epoch markers
    # into shard queues through the default exchange.
    grant "$RELAY_USER" "$NOTHING" "^(${P}|amq\\.default)\$" "$NOTHING"
fi

if [ -n "${OPERATOR_PASSWORD:-}" ]; then
    ensure_user "$OPERATOR_USER" "$OPERATOR_PASSWORD"
    # `urutan dlq`: read the DLQ (basic.get; `purge` needs only this);
    # write the entry exchange (`replay` publishes there) and amq.default
    # (a message looked at is put back at the end of the DLQ through the
    # default exchange, never handed back, which would count a delivery).
    # `list` and `show` need none of it while every message is recorded.
    grant "$OPERATOR_USER" "$NOTHING" "^(${P}|amq\\.default)\$" "$DEAD_LETTER_QUEUE"
fi

echo
ctl -q list_permissions -p "$VHOST"

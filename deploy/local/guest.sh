#!/usr/bin/env bash
# Sourced by demo.sh: the demo is a guest on this machine. It looks at the
# services it needs and changes nothing:
#
# - both reachable (PostgreSQL at DATABASE_URL's host:port, RabbitMQ at
#   AMQP_URL's; the defaults are 127.0.0.1:5432 and 127.0.0.1:5672): the
#   demo runs, set-up skipped;
# - a first run on a machine without them (no PostgreSQL server, no
#   RabbitMQ server, or no C linker installed): deploy/local/setup.sh
#   installs and starts them (it prints what it changes first);
# - installed but not running (someone may have stopped them on purpose, an
#   outage drill for instance): the demo says what is down and how to start
#   it (deploy/local/setup.sh), and stops without touching anything.

# host and port of URL $1 (scheme://[user[:pass]@]host[:port][/...]), or
# the defaults $2 $3.
guest_endpoint() {
    local url=$1 host=$2 port=$3 rest
    if [[ -n "$url" ]]; then
        rest=${url#*://}
        rest=${rest%%/*}
        rest=${rest%%\?*}
        rest=${rest##*@}
        # A cluster's list: the first node.
        rest=${rest%%,*}
        if [[ "$rest" == *:* ]]; then
            host=${rest%%:*}
            port=${rest##*:}
        elif [[ -n "$rest" ]]; then
            host=$rest
        fi
    fi
    printf '%s %s\n' "$host" "$port"
}

guest_reachable() { timeout 3 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

# Installed at all? (a machine never set up: the first run sets it up)
guest_first_run() {
    ! command -v cc >/dev/null 2>&1 ||
        ! command -v pg_ctlcluster >/dev/null 2>&1 ||
        ! command -v rabbitmq-server >/dev/null 2>&1
}

# Returns 0 when the demo may go on; runs setup.sh on a first run; prints
# what is down and returns 1 otherwise.
guest_check() {
    local pg_host pg_port amqp_host amqp_port down=()
    read -r pg_host pg_port < <(guest_endpoint "${DATABASE_URL:-}" 127.0.0.1 5432)
    read -r amqp_host amqp_port < <(guest_endpoint "${AMQP_URL:-}" 127.0.0.1 5672)
    if guest_first_run; then
        echo "demo: first run on this machine: deploy/local/setup.sh sets it up"
        bash deploy/local/setup.sh
        return
    fi
    guest_reachable "$pg_host" "$pg_port" || down+=("PostgreSQL at ${pg_host}:${pg_port}")
    guest_reachable "$amqp_host" "$amqp_port" || down+=("RabbitMQ at ${amqp_host}:${amqp_port}")
    if ((${#down[@]} == 0)); then
        echo "demo: PostgreSQL ${pg_host}:${pg_port} and RabbitMQ ${amqp_host}:${amqp_port} are up; set-up skipped"
        return 0
    fi
    local what
    what=$(printf '%s and ' "${down[@]}")
    echo "demo: ${what% and } not reachable; the demo changes nothing on this machine (a service may have been stopped on purpose). Start them with deploy/local/setup.sh (it starts what is stopped), or point DATABASE_URL / AMQP_URL at running ones, then run the demo again." >&2
    return 1
}

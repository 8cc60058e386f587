#!/usr/bin/env bash
# Validate the deployment files offline: alert rules (promtool check + unit
# tests), the PromQL in the Grafana dashboard, every JSON file under deploy/,
# then deploy/validate-manifests.sh (Kubernetes manifests, Dockerfile, YAML
# style) if it exists.
#
# One line per check ("validate: ok|FAIL <check>"), exit 1 if any failed.
# Re-runnable; installs only what is missing (Debian `prometheus` for
# promtool, python3; validate-manifests.sh adds kubernetes-client,
# python3-venv and its Python tools in target/validate-venv, never in the
# system Python), so it needs root (or sudo) only the first time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

failed=0
log() { printf 'validate: %s\n' "$*"; }

# check NAME COMMAND...: runs the command quietly, prints one line, shows the
# command's output only when it fails.
check() {
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        log "ok   ${name}"
    else
        log "FAIL ${name}"
        printf '%s\n' "$out" | sed 's/^/    /' >&2
        failed=1
    fi
}

# shellcheck source=deploy/host.sh
source "$(dirname "${BASH_SOURCE[0]}")/host.sh"

if ! command -v promtool >/dev/null 2>&1; then
    log "installing prometheus (for promtool)"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -q >/dev/null
    as_root apt-get install -y -q --no-install-recommends prometheus >/dev/null
fi
command -v python3 >/dev/null 2>&1 || {
    log "installing python3"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -q >/dev/null
    as_root apt-get install -y -q --no-install-recommends python3 >/dev/null
}

check "promtool check rules deploy/prometheus/alerts.yaml" \
    promtool check rules deploy/prometheus/alerts.yaml
check "promtool test rules deploy/prometheus/alerts.test.yaml" \
    promtool test rules deploy/prometheus/alerts.test.yaml

# Every JSON file under deploy/ parses.
while IFS= read -r -d '' json; do
    check "python3 -m json.tool ${json}" python3 -m json.tool "$json"
done < <(find deploy -name '*.json' -type f -print0 | sort -z)

# The dashboard's queries are valid PromQL: substitute Grafana's variables,
# write each query as a recording rule and let promtool parse them.
dashboard_promql() {
    local rules status=0
    rules=$(mktemp --suffix=.yaml)
    python3 - "$1" >"$rules" <<'EOF' || status=$?
import json, sys

def exprs(node):
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for value in node.values():
            yield from exprs(value)
    elif isinstance(node, list):
        for value in node:
            yield from exprs(value)

dashboard = json.load(open(sys.argv[1]))
substitutions = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
                 "$shard": ".*", "$vhost": ".*"}
print("groups:\n  - name: dashboard\n    rules:")
found = 0
for n, expr in enumerate(exprs(dashboard)):
    for var, value in substitutions.items():
        expr = expr.replace(var, value)
    if "$" in expr:
        sys.exit(f"unknown Grafana variable in: {expr}")
    print(f"      - record: dashboard:query{n}\n        expr: {json.dumps(expr)}")
    found += 1
if found == 0:
    sys.exit("no queries found")
EOF
    [[ $status -ne 0 ]] || promtool check rules "$rules" || status=$?
    rm -f "$rules"
    return "$status"
}
while IFS= read -r -d '' dash; do
    check "promtool parses every query of ${dash}" dashboard_promql "$dash"
done < <(find deploy/grafana -name '*.json' -type f -print0 | sort -z)

# Every broker configuration urutan ships caps the message size near
# MAX_BODY_BYTES (1 MiB): RabbitMQ's default (128 MiB) lets one producer's
# message cost each worker that much memory before it is dead-lettered.
max_message_size() {
    local file=$1 value
    value=$(sed -n 's/^max_message_size[[:space:]]*=[[:space:]]*\([0-9][0-9]*\)[[:space:]]*$/\1/p' "$file")
    [[ -n "$value" ]] || { echo "$file does not set max_message_size"; return 1; }
    ((value >= 1048576 && value <= 16777216)) ||
        { echo "$file: max_message_size = $value is not within 1-16 MiB"; return 1; }
}
for conf in deploy/compose/rabbitmq/rabbitmq.conf deploy/brokers/node.sh; do
    check "max_message_size set in ${conf}" max_message_size "$conf"
done

# The manifests script prints its own line per check: let it through.
if [[ -f deploy/validate-manifests.sh ]]; then
    if bash deploy/validate-manifests.sh; then
        log "ok   bash deploy/validate-manifests.sh"
    else
        log "FAIL bash deploy/validate-manifests.sh"
        failed=1
    fi
else
    log "skip deploy/validate-manifests.sh (not present)"
fi

if ((failed)); then
    log "some checks failed"
    exit 1
fi
log "all checks passed"

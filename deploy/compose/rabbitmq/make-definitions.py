#!/usr/bin/env python3
"""Writes definitions.json (next to this file) for the LOCAL compose stack.

RabbitMQ imports it at boot (rabbitmq.conf: load_definitions): the vhost
`urutan`, an administrator for the management UI and the four
least-privilege users of deploy/rabbitmq/least-privilege.sh with the same
permission patterns (prefix `pesanan`).

The passwords below are EXAMPLES FOR THE LOCAL STACK ONLY (they are in this
public repository). RabbitMQ stores a salted hash, computed here the way
rabbit_password_hashing_sha256 does: base64(salt + sha256(salt + password)),
with a random 4-byte salt.

    python3 deploy/compose/rabbitmq/make-definitions.py          # rewrite
    python3 deploy/compose/rabbitmq/make-definitions.py --check  # verify
"""

import base64
import hashlib
import json
import os
import pathlib
import sys

VHOST = "urutan"
PREFIX = "pesanan"  # TOPOLOGY_PREFIX; '.' is its only regex metacharacter
P = PREFIX.replace(".", "\\.")

# name -> (local-only example password, tags, (configure, write, read)).
# Patterns: deploy/rabbitmq/least-privilege.sh (kept identical, checked by
# deploy/validate-manifests.sh).
USERS = {
    "admin": ("admin-local-only", ["administrator"], (".*", ".*", ".*")),
    "urutan-topology": ("topology-local-only", [], (
        f"^{P}(-hash|\\.dlx|\\.dlq|\\.shard-\\d{{3}}|\\.alive)?$",
        f"^({P}(-hash|\\.dlx|\\.dlq|\\.shard-\\d{{3}})|amq\\.default)$",
        f"^{P}(-hash|\\.dlx|\\.shard-\\d{{3}})?$")),
    "urutan-worker": ("worker-local-only", [], (
        f"^{P}\\.alive$", "^amq\\.default$", f"^{P}\\.shard-\\d{{3}}$")),
    "urutan-relay": ("relay-local-only", [], (
        "^$", f"^({P}|amq\\.default)$", "^$")),
    "urutan-operator": ("operator-local-only", [], (
        "^$", f"^({P}|amq\\.default)$", f"^{P}\\.dlq$")),
}

OUT = pathlib.Path(__file__).resolve().parent / "definitions.json"


def password_hash(password, salt=None):
    """rabbit_password_hashing_sha256: base64(salt4 + sha256(salt4 + utf8))."""
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def hash_matches(stored, password):
    raw = base64.b64decode(stored)
    return password_hash(password, raw[:4]) == stored


def definitions():
    return {
        "rabbit_version": "3.13.0",
        "vhosts": [{"name": VHOST}],
        "users": [
            {"name": name, "password_hash": password_hash(pw),
             "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": tags}
            for name, (pw, tags, _) in USERS.items()
        ],
        "permissions": [
            {"user": name, "vhost": VHOST, "configure": c, "write": w, "read": r}
            for name, (_, _, (c, w, r)) in USERS.items()
        ],
        "topic_permissions": [], "parameters": [], "global_parameters": [],
        "policies": [], "queues": [], "exchanges": [], "bindings": [],
    }


def check():
    """The committed file: every user's hash matches its example password and
    its permissions match USERS."""
    data = json.loads(OUT.read_text())
    problems = []
    users = {u["name"]: u for u in data["users"]}
    perms = {(p["user"], p["vhost"]): p for p in data["permissions"]}
    for name, (pw, tags, (c, w, r)) in USERS.items():
        u = users.get(name)
        if u is None or not hash_matches(u["password_hash"], pw):
            problems.append(f"{name}: password hash does not match")
        elif u.get("hashing_algorithm") != "rabbit_password_hashing_sha256" or u.get("tags") != tags:
            problems.append(f"{name}: hashing_algorithm or tags differ")
        p = perms.get((name, VHOST))
        if p is None or (p["configure"], p["write"], p["read"]) != (c, w, r):
            problems.append(f"{name}: permissions differ")
    if [v["name"] for v in data["vhosts"]] != [VHOST]:
        problems.append("vhosts differ")
    return problems


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        found = check()
        for p in found:
            print(p, file=sys.stderr)
        sys.exit(1 if found else 0)
    OUT.write_text(json.dumps(definitions(), indent=2) + "\n")
    print(f"wrote {OUT}")

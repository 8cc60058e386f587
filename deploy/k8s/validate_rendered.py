#!/usr/bin/env python3
"""Validate rendered Kubernetes manifests (the output of `kubectl kustomize`).

Built-in kinds are checked with kubernetes-validate (strict: unknown fields
are errors) against every Kubernetes version given; the custom resources the
example overlay uses (ServiceMonitor, ScaledObject, TriggerAuthentication) are
checked against the JSON schemas committed in schemas/ (a strict subset of the
upstream CRDs: misspelt or misplaced fields fail). Any other kind fails, so
nothing passes unchecked. Then urutan's own rules (policy()): the restricted
security context on every pod and container, requests and limits, probes on
the worker and the effects dispatcher, a grace period longer than the worker's drain, and KEDA's
maxReplicaCount at most SHARD_COUNT. Works offline.

usage: validate_rendered.py --k8s-version 1.30.0 [--k8s-version ...] FILE...
Prints one line per file; exits 1 on any problem.
"""

import argparse
import json
import pathlib
import sys

import jsonschema
import kubernetes_validate
import yaml

SCHEMAS = pathlib.Path(__file__).resolve().parent / "schemas"
CUSTOM = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication.json",
}


def check(doc, versions):
    """Returns a list of problems with one resource (empty when it is valid)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    name = f"{key[1]}/{doc.get('metadata', {}).get('name')}"
    if key in CUSTOM:
        schema = json.loads((SCHEMAS / CUSTOM[key]).read_text())
        validator = jsonschema.Draft7Validator(schema)
        return [f"{name}: {'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in validator.iter_errors(doc)]
    problems = []
    for version in versions:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{name}: no schema for {key[0]} {key[1]} (add one to schemas/)")
            break
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{name} (k8s {version}): {'/'.join(map(str, e.path))}: {e.message}")
    return problems


# The longest drain of `urutan run` after SIGTERM (a message held in a
# database retry is given up after 20 s); the grace period must exceed it.
DRAIN_SECONDS = 20


def policy(docs):
    """urutan's deployment rules over one rendered file; returns problems."""
    problems = []
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] not in ("Deployment", "Job"):
            continue
        pod = d["spec"]["template"]["spec"]
        psc = pod.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True:
            problems.append(f"{name}: pod securityContext.runAsNonRoot is not true")
        if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{name}: pod seccompProfile is not RuntimeDefault")
        if pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{name}: automountServiceAccountToken is not false")
        if d["kind"] == "Deployment" and pod.get("terminationGracePeriodSeconds", 30) <= DRAIN_SECONDS:
            problems.append(f"{name}: terminationGracePeriodSeconds <= the {DRAIN_SECONDS} s drain")
        for c in pod.get("initContainers", []) + pod["containers"]:
            cname = f"{name} container {c['name']}"
            sc = c.get("securityContext", {})
            wanted = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}
            for field, value in wanted.items():
                if sc.get(field) is not value:
                    problems.append(f"{cname}: securityContext.{field} is not {str(value).lower()}")
            if sc.get("capabilities", {}).get("drop") != ["ALL"]:
                problems.append(f"{cname}: capabilities do not drop ALL")
            if sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                problems.append(f"{cname}: seccompProfile is not RuntimeDefault")
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                if "memory" not in res.get(kind, {}):
                    problems.append(f"{cname}: no memory {kind}")
            if d["kind"] == "Deployment":
                if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
                    problems.append(f"{cname}: liveness probe is not /healthz")
                if d["metadata"]["name"] in ("urutan-worker", "urutan-effects") and \
                        c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
                    problems.append(f"{cname}: readiness probe is not /readyz")
    shards = [int(d["data"]["SHARD_COUNT"]) for d in docs
              if d["kind"] == "ConfigMap" and "SHARD_COUNT" in d.get("data", {})]
    for d in docs:
        if d["kind"] == "ScaledObject" and shards and d["spec"].get("maxReplicaCount", 100) > shards[0]:
            problems.append(f"ScaledObject/{d['metadata']['name']}: maxReplicaCount "
                            f"{d['spec'].get('maxReplicaCount', 100)} > SHARD_COUNT {shards[0]}: "
                            "replicas beyond SHARD_COUNT can only stand by")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k8s-version", action="append", required=True)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    failed = False
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        problems = [p for d in docs for p in check(d, args.k8s_version)]
        if not problems:
            problems = policy(docs)
        kinds = sorted({d["kind"] for d in docs})
        if problems:
            failed = True
            print(f"FAIL {path}: {len(problems)} problem(s)")
            for p in problems:
                print(f"     {p}")
        else:
            print(f"ok   {path}: {len(docs)} resources ({', '.join(kinds)}) valid for "
                  f"k8s {', '.join(args.k8s_version)}, policy ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

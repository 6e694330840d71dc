"""Checks what a schema cannot in deploy/kubernetes: that the manifests
refer to each other correctly. kubernetes-validate accepts a volumeMount
naming no volume, a Secret key that does not exist, a Service that selects
no pod or a `$(VAR)` that is not defined (Kubernetes then passes it on
literally); the API server or the kubelet would only say so at apply time,
or never.

    python3 scripts/lib/check_deploy_refs.py deploy/kubernetes

Prints each problem and exits 1 if there is any.
"""

import re
import sys
from pathlib import Path

import yaml

WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet"}
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def main(root: Path) -> int:
    problems: list[str] = []
    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    listed = kust.get("resources", [])
    for name in listed:
        if not (root / name).is_file():
            problems.append(f"kustomization.yaml lists {name}, which does not exist")
    for path in sorted(root.glob("*.yaml")):
        if path.name != "kustomization.yaml" and path.name not in listed:
            problems.append(f"{path.name} is not in kustomization.yaml's resources")

    docs = []
    for name in listed:
        if (root / name).is_file():
            docs += [(name, d) for d in yaml.safe_load_all((root / name).read_text()) if d]

    secrets = {}
    for _, d in docs:
        if d["kind"] == "Secret":
            keys = set(d.get("stringData", {})) | set(d.get("data", {}))
            secrets[d["metadata"]["name"]] = keys

    def secret_ref(where: str, name: str, key: str | None) -> None:
        if name not in secrets:
            problems.append(f"{where}: Secret {name} is not defined")
        elif key is not None and key not in secrets[name]:
            problems.append(f"{where}: Secret {name} has no key {key}")

    pod_labels = []  # (workload, labels, container ports by name)
    for file, d in docs:
        if d["kind"] not in WORKLOADS:
            continue
        who = f"{file}: {d['kind']}/{d['metadata']['name']}"
        spec = d["spec"]
        template = spec["template"]
        labels = template["metadata"].get("labels", {})
        for k, v in spec["selector"].get("matchLabels", {}).items():
            if labels.get(k) != v:
                problems.append(f"{who}: selector {k}={v} does not match its pod template")
        pod = template["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        volumes |= {c["metadata"]["name"]: {} for c in spec.get("volumeClaimTemplates", [])}
        for v in volumes.values():
            if "secret" in v:
                sec = v["secret"]
                secret_ref(who, sec["secretName"], None)
                for item in sec.get("items", []):
                    secret_ref(who, sec["secretName"], item["key"])
        ports = {}
        for c in pod.get("initContainers", []) + pod["containers"]:
            cwho = f"{who} container {c['name']}"
            cports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
            ports |= cports
            env = set()
            for e in c.get("env", []):
                env.add(e["name"])
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secret_ref(cwho, ref["name"], ref["key"])
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    problems.append(f"{cwho}: mounts volume {m['name']}, which the pod does not define")
                sub = m.get("subPath")
                sec = volumes.get(m["name"], {}).get("secret")
                if sub and sec:
                    secret_ref(cwho, sec["secretName"], sub)
            for arg in c.get("command", []) + c.get("args", []):
                for var in VAR_REF.findall(arg):
                    if var not in env:
                        problems.append(f"{cwho}: $({var}) is not in its env, so it would be passed on literally")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                for how in ("httpGet", "tcpSocket"):
                    port = c.get(probe, {}).get(how, {}).get("port")
                    if isinstance(port, str) and port not in cports:
                        problems.append(f"{cwho}: {probe} uses port {port}, which it does not name")
        pod_labels.append((who, labels, ports))

    def selects(selector: dict) -> list:
        return [w for w in pod_labels if all(w[1].get(k) == v for k, v in selector.items())]

    for file, d in docs:
        who = f"{file}: {d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "Service":
            chosen = selects(d["spec"].get("selector", {}))
            if not chosen:
                problems.append(f"{who}: its selector matches no pod")
            for p in d["spec"]["ports"]:
                target = p.get("targetPort")
                if isinstance(target, str) and not all(target in w[2] for w in chosen):
                    problems.append(f"{who}: targetPort {target} is not a port the selected pods name")
        elif d["kind"] == "StatefulSet":
            svc = d["spec"].get("serviceName")
            if svc and not any(x["kind"] == "Service" and x["metadata"]["name"] == svc for _, x in docs):
                problems.append(f"{who}: serviceName {svc} is not a Service here")
        elif d["kind"] == "PodDisruptionBudget":
            if not selects(d["spec"]["selector"].get("matchLabels", {})):
                problems.append(f"{who}: its selector matches no pod")
        elif d["kind"] == "NetworkPolicy":
            selectors = [d["spec"]["podSelector"].get("matchLabels", {})]
            for rule in d["spec"].get("ingress", []):
                selectors += [f["podSelector"].get("matchLabels", {}) for f in rule.get("from", []) if "podSelector" in f]
            for sel in selectors:
                if not selects(sel):
                    problems.append(f"{who}: pod selector {sel} matches no pod")

    for p in problems:
        print(f"ERROR {p}")
    if not problems:
        print(f"OK {root}: volumes, Secrets and their keys, ports, selectors and $(VAR)s refer to what exists")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "deploy/kubernetes")))

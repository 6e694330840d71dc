#!/usr/bin/env bash
# Validates the deployment files (deploy/): fails on any manifest or unit a
# cluster or systemd would refuse, or that would silently not work.
#   - deploy/kubernetes/*.yaml against the schemas of Kubernetes $K8S_VERSION
#     (kubernetes-validate, strict: unknown fields are errors too); an
#     unknown kind or apiVersion, which the tool only warns about, fails;
#   - how the manifests refer to each other (scripts/lib/check_deploy_refs.py);
#   - the rendered kustomization, where kubectl is installed;
#   - deploy/systemd/*.service with systemd-analyze verify, where installed;
#   - deploy/registry-cache/nginx.conf with nginx -t, where installed.
# scripts/test.sh runs it; it takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
# The newest Kubernetes that kubernetes-validate 1.37.0 has schemas for.
K8S_VERSION=1.37.0
KV_VERSION=1.37.0
failed=0

# Debian's python3 refuses pip installs outside a venv (PEP 668) unless told.
pip_install() { python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"; }
supports() { python3 -c "import sys, kubernetes_validate.utils as u; sys.exit('$K8S_VERSION' not in u.all_versions())" 2>/dev/null; }
if ! supports; then
    echo "installing kubernetes-validate $KV_VERSION (schemas up to Kubernetes $K8S_VERSION)" >&2
    pip_install "kubernetes-validate==$KV_VERSION"
    supports || { echo "kubernetes-validate has no schemas for Kubernetes $K8S_VERSION" >&2; exit 1; }
fi

# Runs kubernetes-validate; any ERROR, WARN or FATAL line fails.
k8s_validate() {
    local out rc=0
    out=$(python3 -m kubernetes_validate -k "$K8S_VERSION" --strict --quiet "$@" 2>&1) || rc=$?
    [ -n "$out" ] && echo "$out"
    if [ "$rc" != 0 ] || grep -qE '^(ERROR|WARN|FATAL)' <<<"$out"; then
        failed=1
    fi
}

manifests=()
for f in deploy/kubernetes/*.yaml; do
    [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
k8s_validate "${manifests[@]}"
python3 scripts/lib/check_deploy_refs.py deploy/kubernetes || failed=1

if command -v kubectl >/dev/null; then
    rendered=$(mktemp /tmp/warren-kustomize-XXXXXX.yaml)
    if kubectl kustomize deploy/kubernetes >"$rendered"; then
        k8s_validate "$rendered"
    else
        failed=1
    fi
    rm -f "$rendered"
else
    echo "kubectl not installed: the kustomization is checked by its resource list only" >&2
fi
echo "deploy/kubernetes: ${#manifests[@]} manifests checked against Kubernetes $K8S_VERSION"

# The units name /usr/local/bin/warren, which a test machine need not
# have: verify copies whose ExecStart runs /bin/true with the same flags.
# systemd-analyze verify only warns about unknown keys and bad values, so
# any output fails.
if command -v systemd-analyze >/dev/null; then
    units=$(mktemp -d /tmp/warren-units-XXXXXX)
    for u in deploy/systemd/*.service; do
        sed 's#^ExecStart=/usr/local/bin/warren #ExecStart=/bin/true #' "$u" >"$units/$(basename "$u")"
    done
    out=$(systemd-analyze verify --man=no "$units"/*.service 2>&1) || failed=1
    if [ -n "$out" ]; then
        echo "$out"
        failed=1
    fi
    rm -rf "$units"
    echo "deploy/systemd: $(ls deploy/systemd/*.service | wc -l) units verified"
else
    echo "systemd-analyze not installed: deploy/systemd not verified" >&2
fi

# The registry cache's nginx config, with its placeholder upstream and
# paths written in (nginx resolves the upstream's name as it loads).
if command -v nginx >/dev/null; then
    cache=$(mktemp -d /tmp/warren-registry-cache-XXXXXX)
    sed -e "s#UPSTREAM#127.0.0.1:5000#g; s#/var/cache/warren-registry-cache#$cache/data#" \
        -e "s#/var/log/warren-registry-cache.log#$cache/access.log#; s#/run/warren-registry-cache.pid#$cache/nginx.pid#" \
        deploy/registry-cache/nginx.conf >"$cache/nginx.conf"
    nginx -t -q -c "$cache/nginx.conf" -p "$cache" || failed=1
    rm -rf "$cache"
    echo "deploy/registry-cache: nginx.conf checked"
else
    echo "nginx not installed: deploy/registry-cache not checked" >&2
fi

if [ "$failed" != 0 ]; then
    echo "deploy/: invalid (above)" >&2
    exit 1
fi
echo "deploy/: valid"

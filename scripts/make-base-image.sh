#!/usr/bin/env bash
# Builds a Debian base image from the distribution's packages, without any
# container registry: mmdebstrap makes the root file system from the apt
# mirror, umoci writes it as an OCI image layout, packed as a tar that
# `warren image import` takes.
#
#   scripts/make-base-image.sh OUT.tar [--suite bookworm] [--include PKG,PKG...] [--e2b-user] [--tag TAG] [--hook CMD]...
#
# --e2b-user gives the image what E2B's `base` template has and its SDKs
# expect: bash, python3, git and sudo, and a user `user` (uid 1000, home
# /home/user, passwordless sudo), whom Warren's E2B door runs calls as.
# --hook CMD (repeatable) runs CMD after the packages, as mmdebstrap's
# --customize-hook: "$1" is the new root (scripts/fusion-suite.sh adds
# /etc/hosts, tsx from npm and a few command names with it).
# The tests build their Debian images with this script (tests/debian.py).
set -euo pipefail

usage() { echo "usage: make-base-image.sh OUT.tar [--suite S] [--include P,P] [--e2b-user] [--tag T] [--hook CMD]..." >&2; exit 2; }
out=${1:-}
[ -n "$out" ] && [ "${out#-}" = "$out" ] || usage
shift
suite=bookworm include=python3 tag=latest e2b=0
extra_hooks=()
while [ $# -gt 0 ]; do
    case "$1" in
        --suite) suite=${2:?}; shift 2 ;;
        --include) include=${2:?}; shift 2 ;;
        --tag) tag=${2:?}; shift 2 ;;
        --e2b-user) e2b=1; shift ;;
        --hook) extra_hooks+=(--customize-hook="${2:?}"); shift 2 ;;
        *) usage ;;
    esac
done
for tool in mmdebstrap umoci; do
    command -v "$tool" >/dev/null || { echo "$tool is not installed (scripts/install-deps.sh --test)" >&2; exit 1; }
done
if [ "$e2b" = 1 ]; then
    include="$include,bash,python3,git,sudo,passwd"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
hooks=()
if [ "$e2b" = 1 ]; then
    # In the new root, after the packages: E2B's user.
    hooks+=(--customize-hook='chroot "$1" useradd --create-home --uid 1000 --shell /bin/bash user')
    hooks+=(--customize-hook='echo "user ALL=(ALL:ALL) NOPASSWD: ALL" > "$1/etc/sudoers.d/user" && chmod 0440 "$1/etc/sudoers.d/user"')
fi
hooks+=("${extra_hooks[@]}")
# No device nodes: images may not carry them (each sandbox gets Warren's /dev).
mmdebstrap --quiet --variant=essential --include="$include" --mode=root \
    --skip=output/dev "${hooks[@]}" "$suite" "$work/rootfs.tar"
umoci init --layout "$work/oci"
umoci new --image "$work/oci:$tag"
umoci unpack --image "$work/oci:$tag" "$work/bundle" >/dev/null
tar -C "$work/bundle/rootfs" -xf "$work/rootfs.tar"
umoci repack --image "$work/oci:$tag" "$work/bundle" >/dev/null
tar -C "$work/oci" -cf "$out.partial" .
mv "$out.partial" "$out"
user=""
[ "$e2b" = 1 ] && user=", user 'user'"
echo "$out: Debian $suite ($include$user) as an OCI archive, tag $tag; import it with: warren image import $out --name NAME:TAG"

#!/usr/bin/env bash
# Builds a small OCI image-layout tar from Debian's busybox-static with umoci:
#   scripts/make-busybox-image.sh OUT.tar [TAG]
# Used by the demo, the tests and the benchmark; needs nothing from the network.
set -euo pipefail
out=${1:?usage: make-busybox-image.sh OUT.tar [TAG]}
tag=${2:-latest}
busybox=$(command -v busybox || true)
[ -x /bin/busybox ] && busybox=/bin/busybox
[ -n "$busybox" ] || { echo "busybox-static is not installed (apt-get install busybox-static)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umoci init --layout "$work/oci"
umoci new --image "$work/oci:$tag"
umoci unpack --image "$work/oci:$tag" "$work/bundle" >/dev/null
root="$work/bundle/rootfs"
mkdir -p "$root"/{bin,etc,tmp,root,home/user,proc,sys,dev,var/tmp,usr/bin}
chmod 1777 "$root/tmp" "$root/var/tmp"
cp "$busybox" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
cat > "$root/etc/passwd" <<'PW'
root:x:0:0:root:/root:/bin/sh
user:x:1000:1000:user:/home/user:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PW
cat > "$root/etc/group" <<'GR'
root:x:0:
user:x:1000:
nogroup:x:65534:
GR
chown 1000:1000 "$root/home/user"
echo "warren-busybox" > "$root/etc/hostname"
umoci repack --image "$work/oci:$tag" "$work/bundle" >/dev/null
# After repack: repack rewrites the config from the bundle's saved copy.
umoci config --image "$work/oci:$tag" \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.cmd /bin/sh --config.workingdir /
umoci gc --layout "$work/oci"
tar -C "$work/oci" -cf "$out" .
echo "$out"

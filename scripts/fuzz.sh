#!/usr/bin/env bash
# Runs each cargo-fuzz target (fuzz/) for SECONDS (default 20) from its
# hand-made hostile seeds plus the corpus earlier runs grew. Needs root
# (the layer unpacker makes overlay whiteouts) and the nightly toolchain.
#   scripts/fuzz.sh            # CI: 20 s each
#   scripts/fuzz.sh 3600 files # one target for an hour
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(spec image_unpack files)
mkdir -p /tmp/warren-fuzz-image /tmp/warren-fuzz-files
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    echo "fuzz: $t for ${secs}s" >&2
    # The targets unpack and write under /tmp/warren-fuzz-*: a tmpfs there,
    # private to this mount namespace, makes them about ten times faster
    # than ext4 and vanishes with the run.
    unshare --mount --propagation private sh -c '
        mount -t tmpfs -o size=1g warren-fuzz /tmp/warren-fuzz-image &&
        mount -t tmpfs -o size=1g warren-fuzz /tmp/warren-fuzz-files &&
        exec "$@"' sh \
        cargo +nightly fuzz run "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1
done

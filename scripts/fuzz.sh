#!/usr/bin/env bash
# The cargo-fuzz targets (fuzz/). Two modes:
#
#   scripts/fuzz.sh replay [TARGET...]           # CI: every committed input, once
#   scripts/fuzz.sh explore SECONDS [TARGET...]  # open-ended search, outside CI
#   scripts/fuzz.sh minimize [TARGET...]         # shrink the grown corpus to commit it
#
# `replay` runs each target over its hand-made hostile seeds (fuzz/seeds),
# the committed corpus (fuzz/corpus) and every input that ever made it fail
# (fuzz/regressions): deterministic, so a submission's CI never depends on
# what a random search happens to find that day. `explore` grows the corpus
# in fuzz/corpus/TARGET; a crash it finds lands in fuzz/artifacts/TARGET:
# fix it, copy the input to fuzz/regressions/TARGET and commit both.
#
# Needs root (the layer unpacker makes overlay whiteouts) and the nightly
# toolchain (scripts/install-deps.sh --test installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-replay}
shift || true
secs=0
if [ "$mode" = explore ]; then
    secs=${1:?explore needs a number of seconds}
    shift
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(spec image_unpack files)
mkdir -p /tmp/warren-fuzz-image /tmp/warren-fuzz-files

# The targets unpack and write under /tmp/warren-fuzz-*: a tmpfs there,
# private to this mount namespace, makes them about ten times faster than
# ext4 and vanishes with the run.
in_tmpfs() {
    unshare --mount --propagation private sh -c '
        mount -t tmpfs -o size=1g warren-fuzz /tmp/warren-fuzz-image &&
        mount -t tmpfs -o size=1g warren-fuzz /tmp/warren-fuzz-files &&
        exec "$@"' sh "$@"
}

for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/regressions/$t"
    case "$mode" in
    replay)
        n=$(find "fuzz/seeds/$t" "fuzz/corpus/$t" "fuzz/regressions/$t" -type f | wc -l)
        echo "fuzz: replaying $n inputs of $t" >&2
        # -runs=0 executes each input once and stops; nothing is mutated.
        # --dev: the inputs run once each (seconds either way), so the
        # optimised build, one codegen unit per crate, is not worth its
        # 13 minutes on two cores; sanitizer, debug assertions and
        # overflow checks are the same.
        in_tmpfs cargo +nightly fuzz run --dev "$t" "fuzz/seeds/$t" "fuzz/corpus/$t" "fuzz/regressions/$t" -- \
            -runs=0 -timeout=10 -rss_limit_mb=4096
        ;;
    explore)
        echo "fuzz: exploring $t for ${secs}s" >&2
        # The first directory is the one libFuzzer adds new inputs to.
        in_tmpfs cargo +nightly fuzz run "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" "fuzz/regressions/$t" -- \
            -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1
        ;;
    minimize)
        echo "fuzz: minimizing the corpus of $t" >&2
        in_tmpfs cargo +nightly fuzz cmin "$t" "fuzz/corpus/$t" -- -rss_limit_mb=4096
        ;;
    *)
        echo "usage: scripts/fuzz.sh replay|explore SECONDS|minimize [TARGET...]" >&2
        exit 2
        ;;
    esac
done

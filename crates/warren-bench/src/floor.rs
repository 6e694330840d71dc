//! `warren-bench floor`: one cycle of [`warren_runtime::floor`], for
//! `scripts/bench.sh` to time as a process, as it times `runc run`.

use std::path::Path;

pub fn run(rootfs: &Path) -> i32 {
    let scratch = std::env::temp_dir().join(format!("warren-floor-{}", std::process::id()));
    // One that could not be made is not this run's to remove.
    if let Err(e) = std::fs::create_dir(&scratch) {
        say!("error: scratch directory {}: {e}", scratch.display());
        return 1;
    }
    let result = warren_runtime::floor::run_cycle(rootfs, &scratch);
    // The overlay was mounted in the probe's own mount namespace only.
    let _ = std::fs::remove_dir_all(&scratch);
    match result {
        Ok(()) => 0,
        Err(e) => {
            say!("error: {e}");
            1
        }
    }
}

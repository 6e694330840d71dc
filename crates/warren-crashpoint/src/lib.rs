//! Crash injection for the recovery tests: when `WARREN_CRASH_AT` names a
//! point, the process aborts there, as a power cut or `kill -9` would. The
//! variable is read once; unset (always, in production) it costs one load.
//!
//! A crate of its own because it does I/O (an environment read, setrlimit,
//! abort), which `warren-core`, plain types only, must not; the runtime and
//! the control plane both mark points with it.

use std::sync::OnceLock;

/// Aborts the process here when `WARREN_CRASH_AT` is `point`.
pub fn hit(point: &str) {
    static TARGET: OnceLock<Option<String>> = OnceLock::new();
    let target = TARGET.get_or_init(|| std::env::var("WARREN_CRASH_AT").ok());
    if target.as_deref() == Some(point) {
        eprintln!("warren: crash injected at {point}");
        // No core file in the working directory of whoever runs the tests.
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Core,
            rustix::process::Rlimit {
                current: Some(0),
                maximum: Some(0),
            },
        );
        std::process::abort();
    }
}

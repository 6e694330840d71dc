//! The error of a step that is one system call or file operation: what it
//! was for, and the errno. Its own module so that the small host-facing
//! modules (rootfs, host_tables, cgroup_tuning, init, setup) share one
//! shape, and a caller can still look at the errno (`source`).

use std::io;

use thiserror::Error;

#[derive(Debug, Error)]
#[error("{what}: {source}")]
pub struct OsError {
    /// What was being done, in words ("create /sys/fs/cgroup/warren").
    pub what: String,
    pub source: io::Error,
}

impl OsError {
    /// `e` (an [`io::Error`], or nix's or rustix's errno) while doing `what`.
    pub fn new(what: impl Into<String>, e: impl Into<io::Error>) -> OsError {
        OsError {
            what: what.into(),
            source: e.into(),
        }
    }

    /// The last errno of this thread (after a raw libc call) while doing `what`.
    pub fn last(what: impl Into<String>) -> OsError {
        OsError::new(what, io::Error::last_os_error())
    }
}

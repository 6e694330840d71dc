//! What can go wrong in Warren's own set-up of a sandbox: a system call
//! (with what it was for and the errno), a config this path does not set
//! up, or the child's own report. Typed up to [`super::spawn`]; only the
//! clone's report crosses its pipe as text (see `child`).

use std::path::PathBuf;

use thiserror::Error;

use crate::os_error::OsError;
use crate::RuntimeError;

#[derive(Debug, Error)]
pub enum SetupError {
    #[error(transparent)]
    Os(#[from] OsError),
    /// The config asks for something this path does not set up, or that
    /// would leave the root (a mount destination with `..`).
    #[error("{0}")]
    Unsupported(String),
    /// The host cannot give a sandbox what its config asks (swap it does
    /// not account, say).
    #[error("{0}")]
    Host(&'static str),
    #[error("{} is not a config Warren can set up: {source}", path.display())]
    Config {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{what}: {source}")]
    Caps {
        what: String,
        source: caps::errors::CapsError,
    },
    /// Resolving a path inside the image's root was refused (a link out of
    /// it, a file where a directory must be).
    #[error("{what}: {source}")]
    InRoot {
        what: String,
        source: Box<RuntimeError>,
    },
    /// A step made of steps failed: which one, and why.
    #[error("{what}: {source}")]
    Step {
        what: String,
        source: Box<SetupError>,
    },
    /// The sandbox's init failed its own set-up; its report is text, the
    /// only thing that crosses the pipe from the clone.
    #[error("{0}")]
    Init(String),
    /// The spawner gave up on the sandbox before its set-up began.
    #[error("the spawner gave up on this sandbox")]
    GivenUp,
}

impl SetupError {
    /// `e` (an I/O error or an errno) while doing `what`.
    pub(super) fn os(what: impl Into<String>, e: impl Into<std::io::Error>) -> SetupError {
        SetupError::Os(OsError::new(what, e))
    }

    /// The errno of the last raw libc call, while doing `what`.
    pub(super) fn last_os(what: impl Into<String>) -> SetupError {
        SetupError::Os(OsError::last(what))
    }

    /// This error as the cause of the larger step `what`.
    pub(super) fn within(self, what: impl Into<String>) -> SetupError {
        SetupError::Step {
            what: what.into(),
            source: Box::new(self),
        }
    }
}

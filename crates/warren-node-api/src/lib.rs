//! The node contract: everything the control plane asks of a node, as
//! serializable requests, answers, byte streams and a sequenced event feed
//! ([`NodeApi`]). No host descriptor, path or socket crosses it, and errors
//! carry a category ([`ErrorKind`]), not an HTTP status. `warren up` drives
//! its node in-process through this trait; a cluster drives remote nodes
//! over HTTP through the same one.

#![forbid(unsafe_code)]

pub mod api;
pub mod calls;
pub mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod types;

#[doc(hidden)]
pub use async_trait;

pub use api::{
    failed_stream, ByteStream, FileRead, NodeApi, PullUpdate, Tunnel, WatchEvent, WatchKind,
};
pub use error::{ErrorKind, NodeError, NodeResult};
pub use types::*;

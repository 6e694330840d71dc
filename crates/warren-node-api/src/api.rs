//! The trait the control plane drives a node through. Every method is a
//! request and an answer, or a stream; the in-process transport calls the
//! node directly, the HTTP transport carries the same values.

use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};
use warren_core::spec::NetworkSpec;
use warren_core::volume::{VolumeInfo, VolumeName, VolumeRequest};
use warren_core::{ExecEvent, ExecRequest, SandboxSpec, Usage, WindowSize};

use crate::error::{NodeError, NodeResult};
use crate::types::*;

/// Bytes in either direction (a file, an archive, a log).
pub type ByteStream = BoxStream<'static, NodeResult<Bytes>>;

/// A raw connection to a port inside a sandbox.
pub trait Tunnel: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Tunnel for T {}

/// A pull's progress, then how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PullUpdate {
    /// One of the image store's pull events (`resolved`, `manifest`,
    /// `progress`, `layer`, `done`), as it reports it.
    Progress {
        event: serde_json::Value,
    },
    Image {
        image: ImageInfo,
    },
    Error {
        error: NodeError,
    },
}

pub use warren_core::files::WatchKind;

/// One line of a directory watch: an event, or the error that ended it.
pub type WatchEvent = warren_core::files::WatchEvent<NodeError>;

/// A read of a sandbox path: what it is, then its bytes.
pub type FileRead = warren_core::files::FileRead<ByteStream>;

/// Declares [`NodeApi`] from the call list ([`crate::node_calls!`]).
macro_rules! declare_node_api {
    ($(
        $(#[$meta:meta])*
        $shape:ident $deadline:ident fn $name:ident(
            $($arg:ident : $ty:ty $(=> $wire:ty)?),* $(; $body:ident : $body_ty:ty)?
        ) -> $reply:ty;
    )*) => {
        /// Everything the control plane asks of a node. A node owns its
        /// sandboxes' processes, files, logs, network state and images,
        /// journals them and takes them over again when it restarts, and
        /// enforces their lifetimes itself; the control plane owns intent
        /// (specs, states, placement, the queue) and learns what happens
        /// from `events`. The calls are declared in [`crate::calls`].
        #[async_trait::async_trait]
        pub trait NodeApi: Send + Sync {
            $(
                $(#[$meta])*
                async fn $name(&self, $($arg: $ty,)* $($body: $body_ty)?) -> NodeResult<$reply>;
            )*
        }
    };
}

crate::node_calls!(declare_node_api);

/// A stream that yields one error: for transports that fail before any
/// byte moved.
pub fn failed_stream(e: NodeError) -> ByteStream {
    Box::pin(futures_util::stream::once(async move { Err(e) }))
}

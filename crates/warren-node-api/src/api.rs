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

/// Implements [`NodeApi`] for a type from the call list and a body for
/// each call, headed by its name and its arguments' names (their types
/// are the list's):
///
/// ```ignore
/// warren_node_api::node_impl! { MyNode;
///     info(self) { Ok(self.info.clone()) }
///     status(self, id, _read_usage) { self.status_of(id) }
///     // …every other call
/// }
/// ```
///
/// A call without a body does not compile, unless `else FALLBACK` names a
/// function that answers the calls the type has no body for, given the
/// call's name (`fn(&'static str) -> NodeResult<T>`). No argument may be
/// named `__done`, `__reply` or `__rest`. Each call is two
/// steps of macro expansion: past about 60 calls a crate needs a higher
/// `recursion_limit`.
#[macro_export]
macro_rules! node_impl {
    (
        $ty:ty $(, else $fallback:path)?;
        $($call:ident($s:ident $(, $p:ident)*) $body:block)*
    ) => {
        $crate::node_impl!(@ ($) [$ty] [$($fallback)?] $($call($s $(, $p)*) $body)*);
    };
    // `$d` is a `$` for the macros this one defines: one that takes the
    // list's entries one by one, and one that makes an entry's method.
    (
        @ ($d:tt) [$ty:ty] [$($fallback:path)?]
        $($call:ident($s:ident $(, $p:ident)*) $body:block)*
    ) => {
        macro_rules! __node_methods {
            ([$d($d done:tt)*]) => {
                #[$crate::async_trait::async_trait]
                impl $crate::NodeApi for $ty { $d($d done)* }
            };
            (
                [$d($d done:tt)*]
                $d(#[$d meta:meta])* $d shape:ident $d deadline:ident fn $d name:ident(
                    $d($d arg:ident : $d ty:ty $d(=> $d wire:ty)?),*
                    $d(; $d body:ident : $d body_ty:ty)?
                ) -> $d reply:ty;
                $d($d rest:tt)*
            ) => {
                __node_method!(
                    [$d($d done)*] $d name($d($d ty,)* $d($d body_ty,)?) -> $d reply;
                    $d($d rest)*
                );
            };
        }
        macro_rules! __node_method {
            $(([$d($d __done:tt)*] $call($($d $p:ty,)*) -> $d __reply:ty; $d($d __rest:tt)*) => {
                __node_methods!([$d($d __done)*
                    async fn $call(&$s, $($p: $d $p),*) -> $crate::NodeResult<$d __reply> $body
                ] $d($d __rest)*);
            };)*
            $(([$d($d done:tt)*] $d name:ident($d($d ty:ty,)*) -> $d reply:ty; $d($d rest:tt)*) => {
                __node_methods!([$d($d done)*
                    async fn $d name(&self, $d(_: $d ty),*) -> $crate::NodeResult<$d reply> {
                        $fallback(stringify!($d name))
                    }
                ] $d($d rest)*);
            };)?
        }
        $crate::node_calls!(__node_methods []);
    };
}

/// A stream that yields one error: for transports that fail before any
/// byte moved.
pub fn failed_stream(e: NodeError) -> ByteStream {
    Box::pin(futures_util::stream::once(async move { Err(e) }))
}

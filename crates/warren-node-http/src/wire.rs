//! What both sides agree on besides the contract's own types: each call's
//! arguments as JSON, what a stream's values need, the headers, and how an
//! error kind maps to an HTTP status.

use std::time::Duration;

use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use warren_core::ExecEvent;
use warren_node_api::{ErrorKind, NodeError, PullUpdate, Sequenced, WatchEvent};

/// Where the API lives on a node; versioned so a node and a control plane
/// of different releases can tell they disagree.
/// `v2`: every call is `POST /node/v2/{call}` with its arguments by name.
pub(crate) const PREFIX: [&str; 2] = ["node", "v2"];

/// Whether a read found a file or a directory (a tar archive).
pub(crate) const FILE_KIND: &str = "x-warren-file-kind";

/// The most a JSON request body may hold; files and archives stream and are
/// not bound by it.
pub(crate) const JSON_LIMIT: usize = 32 << 20;

pub(crate) fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::NoRoom => StatusCode::INSUFFICIENT_STORAGE,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Fenced => StatusCode::PRECONDITION_FAILED,
    }
}

/// A guess for an answer without a `NodeError` body: something other than
/// the node answered (a proxy, a server of another kind on that port).
pub(crate) fn kind_of_status(status: StatusCode) -> ErrorKind {
    match status {
        StatusCode::NOT_FOUND => ErrorKind::NotFound,
        StatusCode::CONFLICT => ErrorKind::Conflict,
        StatusCode::INSUFFICIENT_STORAGE => ErrorKind::NoRoom,
        // Whatever stands in front of the node could not reach it.
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT => {
            ErrorKind::Unavailable
        }
        s if s.is_client_error() => ErrorKind::Invalid,
        _ => ErrorKind::Internal,
    }
}

/// The query parameter that carries a call's arguments (as JSON) when its
/// body is something else: an upload's bytes, a tunnel's connection.
pub(crate) const ARGS: &str = "args";

/// A query of one `args` parameter.
#[derive(Debug, Deserialize)]
pub(crate) struct ArgsQuery {
    pub args: String,
}

/// Declares, from the call list, each call's arguments as the JSON object
/// that crosses the wire (`{"id": …, "read_usage": …}`), named as the
/// call, with the wire form of each argument.
macro_rules! call_args {
    ($(
        $(#[$meta:meta])*
        $shape:ident $deadline:ident fn $name:ident(
            $($arg:ident : $ty:ty $(=> $wire:ty)?),* $(; $body:ident : $body_ty:ty)?
        ) -> $reply:ty;
    )*) => {
        $(
            #[derive(Serialize, Deserialize)]
            #[serde(deny_unknown_fields)]
            #[allow(non_camel_case_types)]
            pub(crate) struct $name {
                $(pub $arg: warren_node_api::wire_type!($ty $(, $wire)?),)*
            }
        )*
    };
}

/// Every call's arguments, by the call's name.
pub(crate) mod args {
    use serde::{Deserialize, Serialize};
    use warren_node_api::calls::prelude::*;

    warren_node_api::node_calls!(call_args);
}

/// What a stream's values need besides their JSON: whether the stream is
/// kept alive with heartbeats, and what a broken connection becomes.
pub(crate) trait Feed: Serialize + DeserializeOwned + Send + 'static {
    /// The server sends a blank line after the first of these without a
    /// value; the client takes the stream as lost after the second.
    const HEARTBEAT: Option<(Duration, Duration)> = None;

    /// The last value of a stream whose connection broke, if it has one.
    fn lost(e: NodeError) -> Option<Self>;
}

/// The event feed is silent while nothing happens: a blank line every 15 s
/// tells a quiet node from a dead connection, and a feed silent for 60 s
/// (several missed heartbeats) is taken as lost. It ends with its
/// connection (the consumer resumes from the last seq it handled).
impl Feed for Sequenced {
    const HEARTBEAT: Option<(Duration, Duration)> =
        Some((Duration::from_secs(15), Duration::from_secs(60)));

    fn lost(e: NodeError) -> Option<Self> {
        tracing::info!("node event feed ended: {e}");
        None
    }
}

/// Dropping an exec's stream drops the connection, which the node takes as
/// a kill; a connection that broke says so as the exec's last event.
impl Feed for ExecEvent {
    fn lost(e: NodeError) -> Option<Self> {
        Some(ExecEvent::Error {
            message: format!("the command's output stopped: {}", e.message),
        })
    }
}

impl Feed for WatchEvent {
    fn lost(error: NodeError) -> Option<Self> {
        Some(WatchEvent::Error { error })
    }
}

/// The pull itself runs on at the node; only its progress is lost.
impl Feed for PullUpdate {
    fn lost(error: NodeError) -> Option<Self> {
        Some(PullUpdate::Error { error })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_status_that_maps_back() {
        for kind in [
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::Invalid,
            ErrorKind::NoRoom,
            ErrorKind::Internal,
        ] {
            assert_eq!(kind_of_status(status_of(kind)), kind);
        }
        // Without the node's body a 502/503 means the node was not reached.
        assert_eq!(
            kind_of_status(status_of(ErrorKind::Upstream)),
            ErrorKind::Unavailable
        );
    }
}

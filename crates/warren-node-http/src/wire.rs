//! What both sides agree on besides the contract's own types: the bodies
//! and queries of routes whose arguments are not one contract value, the
//! headers, and how an error kind maps to an HTTP status.

use std::time::Duration;

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use warren_node_api::{ErrorKind, LogNote};

/// Where the API lives on a node; versioned so a node and a control plane
/// of different releases can tell they disagree.
pub(crate) const PREFIX: [&str; 2] = ["node", "v1"];

/// Whether a read found a file or a directory (a tar archive).
pub(crate) const FILE_KIND: &str = "x-warren-file-kind";

/// The most a JSON request body may hold; files and archives stream and are
/// not bound by it.
pub(crate) const JSON_LIMIT: usize = 32 << 20;

/// The event feed is silent while nothing happens; a blank line this often
/// lets the client tell a quiet node from a dead connection.
pub(crate) const EVENTS_HEARTBEAT: Duration = Duration::from_secs(15);

/// A feed silent this long (several missed heartbeats) is taken as lost;
/// the consumer reconnects with the last `seq` it saw.
pub(crate) const EVENTS_IDLE: Duration = Duration::from_secs(60);

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

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SinceQuery {
    #[serde(default)]
    pub since: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StatusQuery {
    /// Absent (a control plane older than the flag): read now, as it expects.
    #[serde(default = "read_now")]
    pub read_usage: bool,
}

fn read_now() -> bool {
    true
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WhyQuery {
    #[serde(default)]
    pub why: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FollowQuery {
    #[serde(default)]
    pub follow: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PathQuery {
    pub path: String,
}

/// A directory watch's arguments.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WatchQuery {
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

/// A write's arguments ride in the query because its body is the file.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WriteQuery {
    pub path: String,
    pub mode: u32,
    #[serde(default)]
    pub tar: bool,
    /// `WriteFile::xattrs` as a JSON object (absent: none).
    #[serde(default)]
    pub xattrs: Option<String>,
}

/// A volume write's arguments, in the query as a sandbox write's.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct VolumeWriteQuery {
    pub path: String,
    pub mode: u32,
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
    #[serde(default)]
    pub replace: bool,
    /// `WriteFile::xattrs` as a JSON object (absent: none).
    #[serde(default)]
    pub xattrs: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct NameQuery {
    pub name: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReferenceQuery {
    pub reference: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PausedBody {
    pub paused: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct HoldBody {
    pub hold_for_ms: u64,
    pub note: LogNote,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TtlBody {
    pub ttl_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReferenceBody {
    pub reference: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PushBody {
    pub reference: String,
    #[serde(default)]
    pub source: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct GcBody {
    #[serde(default)]
    pub budget: Option<u64>,
}

/// Milliseconds of a duration, saturating: durations beyond u64 ms are
/// "forever" for every caller.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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

    #[test]
    fn millis_saturates() {
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}

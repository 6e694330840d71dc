//! The facade's byte streams, file reads and watch events: what a front
//! door sends and gets for files, archives, logs and directory watches,
//! with the API's errors (a door never sees a node's).

use axum::body::{Body, Bytes};
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use warren_core::ApiError;

use crate::node_errors::{node_error, upload_error};

/// Bytes as the front doors send and get them (a file, an archive, a
/// log); an error ends them.
pub type ByteStream = BoxStream<'static, Result<Bytes, ApiError>>;

/// A read of a sandbox's or a volume's path: what it is, then its bytes.
pub type FileRead = warren_core::files::FileRead<ByteStream>;

/// One line of a directory watch.
pub type WatchEvent = warren_core::files::WatchEvent<ApiError>;

/// A request's body as the bytes of an upload (a file, an archive, a build
/// context); a client that stops sending ends it with a bad request.
pub fn upload(body: Body) -> ByteStream {
    body.into_data_stream()
        .map(|r| r.map_err(|e| ApiError::bad_request(format!("upload interrupted: {e}"))))
        .boxed()
}

/// A node's read as a front door gets it.
pub(crate) fn file_read(read: warren_node_api::FileRead) -> FileRead {
    FileRead {
        kind: read.kind,
        body: from_node(read.body),
    }
}

/// A node's bytes (a file, an archive, a log) as a front door gets them.
pub(crate) fn from_node(body: warren_node_api::ByteStream) -> ByteStream {
    body.map_err(node_error).boxed()
}

/// A front door's bytes as the node takes them.
pub(crate) fn to_node(body: ByteStream) -> warren_node_api::ByteStream {
    body.map_err(upload_error).boxed()
}

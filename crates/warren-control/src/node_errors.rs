//! Where the node contract's errors become what a client sees, and the
//! few that go the other way (an upload a front door could not read):
//! the one place the two vocabularies meet.

use warren_core::{ApiError, ErrorCode};
use warren_node_api::{ErrorKind, NodeError};

/// What a client sees of a node's error: the category decides the status,
/// the node's message (which says what to do) is kept.
pub(crate) fn node_error(e: NodeError) -> ApiError {
    let (code, retry_after_ms) = match e.kind {
        ErrorKind::NotFound => (ErrorCode::NotFound, None),
        ErrorKind::Conflict => (ErrorCode::Conflict, None),
        ErrorKind::Invalid => (ErrorCode::BadRequest, None),
        ErrorKind::NoRoom => (ErrorCode::NoCapacity, Some(5000)),
        ErrorKind::Unavailable => (ErrorCode::Unavailable, Some(1000)),
        ErrorKind::Upstream => (ErrorCode::BadGateway, None),
        ErrorKind::Internal => (ErrorCode::Internal, None),
        // This replica was replaced as leader and exits within a second;
        // a retry reaches the new leader.
        ErrorKind::Fenced => (ErrorCode::Unavailable, Some(1000)),
    };
    ApiError {
        code,
        message: e.message,
        retry_after_ms,
    }
}

/// A front door's error in a body it streams to a node (a client that
/// stopped sending, a part it could not decode): the node gives up the
/// write and answers with it, which [`node_error`] turns back.
pub(crate) fn upload_error(e: ApiError) -> NodeError {
    let kind = match e.code {
        ErrorCode::NotFound => ErrorKind::NotFound,
        ErrorCode::Conflict => ErrorKind::Conflict,
        ErrorCode::NoCapacity => ErrorKind::NoRoom,
        ErrorCode::Unavailable | ErrorCode::TooManyRequests => ErrorKind::Unavailable,
        ErrorCode::BadGateway => ErrorKind::Upstream,
        ErrorCode::Internal => ErrorKind::Internal,
        ErrorCode::BadRequest
        | ErrorCode::Unauthorized
        | ErrorCode::Forbidden
        | ErrorCode::PayloadTooLarge => ErrorKind::Invalid,
    };
    NodeError::new(kind, e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_error_comes_back_as_it_went() {
        for e in [
            ApiError::bad_request("reading the upload: reset"),
            ApiError::not_found("gone"),
            ApiError::conflict("busy"),
            ApiError::internal("bug"),
        ] {
            let back = node_error(upload_error(e.clone()));
            assert_eq!((back.code, &back.message), (e.code, &e.message));
        }
    }
}

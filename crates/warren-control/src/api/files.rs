//! `/v1/sandboxes/{id}/files`: uploads and downloads, streamed;
//! `/v1/sandboxes/{id}/paths`: stat, list, make a directory, rename, remove.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::Deserialize;
use warren_core::{ApiError, ErrorBody};
use warren_node_api::{FileKind, PathEntry, PathOp, WriteFile};

use super::{ApiResult, St};
use crate::api::json_body::JsonBody;

#[derive(Deserialize)]
pub(crate) struct FileQuery {
    path: String,
    mode: Option<String>,
}

/// The `path` parameter exactly as sent. Query decoding replaces bytes that
/// are not UTF-8 with U+FFFD, which would write (or read) a different file
/// than the one named; such a path is refused instead.
pub(crate) fn exact_path(uri: &axum::http::Uri) -> Result<(), ApiError> {
    let raw = uri.query().unwrap_or("");
    for pair in raw.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "path" {
            continue;
        }
        let v = v.replace('+', " ");
        if percent_encoding::percent_decode_str(&v)
            .decode_utf8()
            .is_err()
        {
            return Err(ApiError::bad_request(
                "path is not valid UTF-8 once percent-decoded; Warren's file API takes UTF-8 paths \
                 (for other names, upload or download the directory holding them as a tar)",
            ));
        }
    }
    Ok(())
}

/// Upload a file (raw body) or a directory (body is a tar archive, sent with
/// `Content-Type: application/x-tar`).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", params(("path" = String, Query), ("mode" = Option<String>, Query)),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn put_file(
    State(st): St,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    exact_path(&uri)?;
    let tar = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        == Some("application/x-tar");
    let mode = match &q.mode {
        Some(m) => u32::from_str_radix(m, 8)
            .map_err(|_| ApiError::bad_request(format!("mode {m:?} must be octal, e.g. 0644")))?,
        None => 0o644,
    };
    let body = crate::streams::upload(body);
    let req = WriteFile {
        path: q.path,
        mode,
        tar,
        xattrs: Default::default(),
    };
    st.control.io().write_file(&id, req, body).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Download a file (raw bytes) or a directory (a tar archive).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", params(("path" = String, Query)),
    responses((status = 200, content_type = "application/octet-stream"), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_file(
    State(st): St,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
    uri: axum::http::Uri,
) -> ApiResult<Response> {
    exact_path(&uri)?;
    let read = st.control.io().read_file(&id, &q.path).await?;
    let body = Body::from_stream(read.body.map(|r| r.map_err(std::io::Error::other)));
    Ok(match read.kind {
        // Never more than the length announced (a file that shrinks ends
        // the response early, which the client sees as an incomplete body).
        FileKind::File { size } => (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (header::CONTENT_LENGTH, size.to_string()),
            ],
            body,
        )
            .into_response(),
        FileKind::Dir => ([(header::CONTENT_TYPE, "application/x-tar")], body).into_response(),
    })
}

/// Look at or change paths in the sandbox: `stat`, `list` (down to `depth`
/// levels), `make_dir` (with parents; 409 if the path exists), `rename`
/// (making the destination's parents), `remove` (a directory with all it
/// holds). Final symlinks are described, never followed; every path
/// resolves inside the sandbox. Answers the entries the operation found or
/// made (`remove`: none).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/paths", request_body = PathOp,
    responses((status = 200, body = Vec<PathEntry>), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn path_op(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(op): JsonBody<PathOp>,
) -> ApiResult<Json<Vec<PathEntry>>> {
    Ok(Json(st.control.io().path_op(&id, op).await?))
}

//! What every E2B handler answers with and reads: E2B's errors, JSON
//! bodies, pages of a list, and the control plane it goes through.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use warren_control::Control;
use warren_core::ApiError;

use crate::E2b;

/// An E2B error: `{code, message}` with the HTTP status as code.
#[derive(Debug)]
pub struct E2bError {
    status: StatusCode,
    message: String,
}

impl E2bError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
        }
    }

    /// Its status and message.
    pub(crate) fn parts(self) -> (StatusCode, String) {
        (self.status, self.message)
    }

    pub(crate) fn not_found(id: &str) -> E2bError {
        E2bError::new(
            StatusCode::NOT_FOUND,
            format!("sandbox {id:?} not found (killed, timed out, or never made)"),
        )
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> Self {
        let status =
            StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        E2bError::new(status, e.message)
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        error_response(self.status, json!(self.status.as_u16()), self.message)
    }
}

/// E2B's JSON error (`code`: the status, as a number in the control API
/// and as text in the volume content API), with a retry hint where one
/// helps.
pub(crate) fn error_response(status: StatusCode, code: Value, message: String) -> Response {
    let mut resp = (status, Json(json!({"code": code, "message": message}))).into_response();
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

pub(crate) type E2bResult<T> = Result<T, E2bError>;

pub(crate) fn control(e2b: &E2b) -> E2bResult<Arc<Control>> {
    e2b.control().ok_or_else(|| {
        E2bError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this Warren replica does not lead the cluster yet; retry in a moment",
        )
    })
}

/// A JSON body, with a clear answer when it is not one.
pub(crate) fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> E2bResult<T> {
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })
}

/// One page of a list as E2B pages them: `limit` items (100 unless asked,
/// at most 1000) after the one whose key is `next_token`, and the last
/// one's key in `x-next-token` when more follow.
pub(crate) fn page<T>(
    all: &[T],
    key: impl Fn(&T) -> String,
    next_token: Option<&str>,
    limit: Option<usize>,
    show: impl Fn(&T) -> Value,
) -> Response {
    let start = match next_token.filter(|t| !t.is_empty()) {
        Some(t) => all
            .iter()
            .position(|x| key(x) == t)
            .map_or(all.len(), |i| i + 1),
        None => 0,
    };
    let limit = limit.unwrap_or(100).clamp(1, 1000);
    let page: Vec<&T> = all.iter().skip(start).take(limit).collect();
    let more = start + page.len() < all.len();
    let mut resp = Json(page.iter().map(|x| show(x)).collect::<Vec<_>>()).into_response();
    if more {
        if let Some(last) = page.last() {
            if let Ok(v) = HeaderValue::from_str(&key(last)) {
                resp.headers_mut().insert("x-next-token", v);
            }
        }
    }
    resp
}

//! The one way a handler reads a JSON body: malformed, mistyped or
//! oversize bodies are answered with Warren's `{"error": …}` body and a
//! message that says what was wrong, never with the framework's plain text.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use warren_core::ApiError;

use super::{Failure, MAX_JSON_BODY};

pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = Failure;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let RawBody(body) = RawBody::from_request(req, state).await?;
        parse(&body).map(JsonBody).map_err(Failure)
    }
}

/// A body read whole but not parsed: for a handler that must check who is
/// calling before it says anything about what they sent ([`parse`] then).
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = Failure;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Bytes::from_request(req, state).await.map(RawBody).map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                Failure(ApiError::new(
                    warren_core::ErrorCode::PayloadTooLarge,
                    format!(
                        "the request body is larger than {} MiB; send large data as a file (PUT /v1/sandboxes/{{id}}/files) instead",
                        MAX_JSON_BODY >> 20
                    ),
                ))
            } else {
                Failure(ApiError::bad_request(format!("reading the request body: {e}")))
            }
        })
    }
}

/// A JSON body read already.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

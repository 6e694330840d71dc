//! The Connect protocol as E2B's SDKs speak it (JSON codec only, no
//! compression): unary calls are a JSON body each way; server streams are
//! envelopes (`flags`, big-endian length, JSON) ended by an end-of-stream
//! envelope that carries the error, if any. The JS SDK fails without that
//! end-of-stream envelope, so every stream sends it.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use serde_json::{json, Value};

/// A Connect error code (the names and HTTP statuses of the Connect spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    ResourceExhausted,
    Unimplemented,
    Unavailable,
    DeadlineExceeded,
    Unauthenticated,
    Internal,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::FailedPrecondition => "failed_precondition",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Unauthenticated => "unauthenticated",
            Code::Internal => "internal",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

#[derive(Debug, Clone)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    fn body(&self) -> Value {
        json!({"code": self.code.name(), "message": self.message})
    }
}

/// Warren's error categories as Connect codes.
impl From<warren_core::ApiError> for RpcError {
    fn from(e: warren_core::ApiError) -> Self {
        use warren_core::ErrorCode as E;
        let code = match e.code {
            E::NotFound => Code::NotFound,
            E::Conflict => Code::FailedPrecondition,
            E::BadRequest | E::PayloadTooLarge => Code::InvalidArgument,
            E::Unavailable | E::BadGateway => Code::Unavailable,
            E::TooManyRequests | E::NoCapacity => Code::ResourceExhausted,
            E::Unauthorized => Code::Unauthenticated,
            _ => Code::Internal,
        };
        RpcError::new(code, e.message)
    }
}

/// A unary answer: the message, or the error with its HTTP status.
pub fn unary<T: Serialize>(result: Result<T, RpcError>) -> Response {
    match result {
        Ok(msg) => axum::Json(msg).into_response(),
        Err(e) => (e.code.status(), axum::Json(e.body())).into_response(),
    }
}

/// One envelope: flags, length, message.
fn envelope(flags: u8, msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(flags);
    b.put_u32(msg.len() as u32);
    b.put_slice(msg);
    b.freeze()
}

pub(crate) const END_STREAM: u8 = 0x02;

/// The messages of a server stream, then its end: `Ok(())` or the error.
pub enum Item {
    Message(Value),
    End(Result<(), RpcError>),
    /// The connection drops without an end (what a client sees when the
    /// sandbox behind it is killed).
    Gone,
}

/// A server-stream answer. The stream should end with `Item::End`; if it
/// stops without one, an end-of-stream without error is sent.
pub fn server_stream<S>(items: S) -> Response
where
    S: Stream<Item = Item> + Send + 'static,
{
    let body = items
        .map(|item| match item {
            Item::Message(v) => (false, envelope(0, v.to_string().as_bytes())),
            Item::End(r) => {
                let end = match r {
                    Ok(()) => json!({}),
                    Err(e) => json!({"error": e.body()}),
                };
                (true, envelope(END_STREAM, end.to_string().as_bytes()))
            }
            // No envelope is ever empty: an empty chunk marks the drop.
            Item::Gone => (true, Bytes::new()),
        })
        .scan(false, |done, (is_end, bytes)| {
            if *done {
                return futures_util::future::ready(None);
            }
            *done = is_end;
            futures_util::future::ready(Some((is_end, bytes)))
        });
    let body = EndGuard::new(body).map(|b| {
        if b.is_empty() {
            // An error in the body makes hyper cut the connection.
            Err(std::io::Error::other("the sandbox is gone"))
        } else {
            Ok(b)
        }
    });
    let mut resp = Response::new(Body::from_stream(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    resp
}

/// Appends an end-of-stream envelope if the inner stream stopped without one.
struct EndGuard<S> {
    inner: std::pin::Pin<Box<S>>,
    saw_end: bool,
    finished: bool,
}

impl<S> EndGuard<S> {
    fn new(inner: S) -> Self {
        EndGuard {
            inner: Box::pin(inner),
            saw_end: false,
            finished: false,
        }
    }
}

impl<S: Stream<Item = (bool, Bytes)>> Stream for EndGuard<S> {
    type Item = Bytes;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Bytes>> {
        use std::task::Poll;
        if self.finished {
            return Poll::Ready(None);
        }
        match self.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some((is_end, b))) => {
                self.saw_end |= is_end;
                Poll::Ready(Some(b))
            }
            Poll::Ready(None) => {
                self.finished = true;
                if self.saw_end {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(envelope(END_STREAM, b"{}")))
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A stream that fails before its first message.
pub fn stream_error(e: RpcError) -> Response {
    server_stream(futures_util::stream::iter([Item::End(Err(e))]))
}

/// Decodes a request: a JSON body (unary) or one envelope around it (a
/// server-stream request, `application/connect+json`).
pub fn decode<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, RpcError> {
    let enveloped = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/connect+"));
    let json = if enveloped {
        if body.len() < 5 {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "a streaming request must be one Connect envelope (flags, length, JSON)",
            ));
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        body.get(5..5 + len).ok_or_else(|| {
            RpcError::new(
                Code::InvalidArgument,
                "the Connect envelope is shorter than its length says",
            )
        })?
    } else {
        body
    };
    let json = if json.is_empty() {
        b"{}" as &[u8]
    } else {
        json
    };
    serde_json::from_slice(json)
        .map_err(|e| RpcError::new(Code::InvalidArgument, format!("malformed request: {e}")))
}

/// The messages of a client stream: the body is envelopes, one after
/// another (an end-of-stream envelope, if any, ends them).
pub fn decode_stream<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<Vec<T>, RpcError> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        if rest.len() < 5 {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "a client stream must be Connect envelopes (flags, length, JSON)",
            ));
        }
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let msg = rest.get(5..5 + len).ok_or_else(|| {
            RpcError::new(
                Code::InvalidArgument,
                "a Connect envelope is shorter than its length says",
            )
        })?;
        if flags & END_STREAM != 0 {
            break;
        }
        out.push(serde_json::from_slice(msg).map_err(|e| {
            RpcError::new(Code::InvalidArgument, format!("malformed message: {e}"))
        })?);
        rest = &rest[5 + len..];
    }
    Ok(out)
}

/// How long a call may take (`Connect-Timeout-Ms`); None when not given.
/// One longer than any deadline Warren keeps is refused (it would overflow
/// the clock it is added to).
pub fn timeout(headers: &HeaderMap) -> Result<Option<warren_core::spec::Dur>, RpcError> {
    let Some(ms) = headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
    else {
        return Ok(None);
    };
    warren_core::spec::Dur::new(Duration::from_millis(ms))
        .map(Some)
        .map_err(|e| RpcError::new(Code::InvalidArgument, format!("Connect-Timeout-Ms: {e}")))
}

/// How often a quiet stream sends a keepalive (`Keepalive-Ping-Interval`,
/// in seconds; envd's default is 90).
pub fn keepalive(headers: &HeaderMap) -> Duration {
    let secs = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(90);
    Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_are_flag_length_json() {
        let e = envelope(0, b"{\"a\":1}");
        assert_eq!(&e[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(&e[5..], b"{\"a\":1}");
    }

    #[test]
    fn a_stream_request_is_unwrapped_from_its_envelope() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/connect+json"),
        );
        let body = envelope(0, br#"{"x":2}"#);
        let v: Value = decode(&h, &body).expect("decodes");
        assert_eq!(v["x"], 2);
        assert!(decode::<Value>(&h, &body[..6]).is_err());
    }

    #[test]
    fn a_client_stream_is_its_envelopes_in_order() {
        let mut body = envelope(0, br#"{"n":1}"#).to_vec();
        body.extend_from_slice(&envelope(0, br#"{"n":2}"#));
        body.extend_from_slice(&envelope(END_STREAM, b"{}"));
        let v: Vec<Value> = decode_stream(&body).expect("decodes");
        assert_eq!(v, vec![json!({"n": 1}), json!({"n": 2})]);
        assert!(decode_stream::<Value>(&body[..3]).is_err());
    }

    #[tokio::test]
    async fn a_stream_always_ends_with_an_end_of_stream_envelope() {
        let resp = server_stream(futures_util::stream::iter([Item::Message(json!({"a": 1}))]));
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        let first_len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let rest = &body[5 + first_len..];
        assert_eq!(rest[0], END_STREAM);
        assert_eq!(&rest[5..], b"{}");
    }
}

//! Who may call a node: the node credential (constant-time compared), and
//! the leader fence that refuses a replaced control plane (see
//! [`crate::fence`]).

use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_node_api::{ErrorKind, NodeError};

use crate::fence::{Admitted, Fence, Refusal, LEADER_EPOCH};
use crate::wire;
use warren_core::sync::lock;

/// Runs after `auth`: only a caller with the node credential can move the
/// fence. A call without an epoch (a control plane in the same process as
/// its node, or one that leads alone) is let through.
pub(crate) async fn fenced(State(fence): State<Fence>, mut req: Request, next: Next) -> Response {
    let Some(given) = req.headers().get(LEADER_EPOCH) else {
        return next.run(req).await;
    };
    let Some(given) = given.to_str().ok().and_then(|v| v.parse::<u64>().ok()) else {
        let e = NodeError::invalid(format!("{LEADER_EPOCH} must be a number"));
        return (StatusCode::BAD_REQUEST, Json(e)).into_response();
    };
    match fence.admit(given) {
        Ok(()) => {
            req.extensions_mut().insert(Admitted { given, fence });
            next.run(req).await
        }
        Err(Refusal::Stale { current }) => {
            tracing::warn!(
                given,
                current,
                path = %req.uri().path(),
                "refused a call of a replaced control plane"
            );
            let e = replaced(given, current);
            (wire::status_of(e.kind), Json(e)).into_response()
        }
        Err(Refusal::Unsaved(e)) => {
            tracing::error!(error = %e, "writing the leader epoch");
            let e =
                NodeError::unavailable(format!("the node could not record the leader epoch: {e}"));
            (StatusCode::SERVICE_UNAVAILABLE, Json(e)).into_response()
        }
    }
}

/// What a replaced control plane is told.
pub(crate) fn replaced(given: u64, current: u64) -> NodeError {
    NodeError::new(
        ErrorKind::Fenced,
        format!(
            "this node follows a newer leader (epoch {current}); this control plane \
             (epoch {given}) was replaced and must not act on it"
        ),
    )
}

/// The credential the node API takes; a node that joins a cluster learns
/// it from the control plane after its API is up, and again at a re-join.
#[derive(Clone, Default)]
pub struct Credential(Arc<Mutex<Arc<[u8]>>>);

impl Credential {
    pub fn set(&self, credential: &str) {
        *lock(&self.0) = credential.as_bytes().into();
    }

    /// No credential yet (a node before its join): every call is refused.
    pub(crate) fn is_empty(&self) -> bool {
        lock(&self.0).is_empty()
    }
}

impl From<String> for Credential {
    fn from(s: String) -> Self {
        Credential(Arc::new(Mutex::new(s.into_bytes().into())))
    }
}

pub(crate) async fn auth(
    State(credential): State<Credential>,
    req: Request,
    next: Next,
) -> Response {
    use subtle::ConstantTimeEq;
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes)
        .and_then(bearer)
        .unwrap_or(b"");
    let credential = lock(&credential.0).clone();
    // An empty credential would let a request without any header in.
    if !credential.is_empty() && bool::from(given.ct_eq(&credential)) {
        return next.run(req).await;
    }
    let e = NodeError::invalid(
        "missing or wrong node credential: the node API takes the node credential \
         (Authorization: Bearer <node credential>), not a user's API token",
    );
    (StatusCode::UNAUTHORIZED, Json(e)).into_response()
}

fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    (value.len() >= SCHEME.len() && value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME))
        .then(|| &value[SCHEME.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bear"), None);
    }
}

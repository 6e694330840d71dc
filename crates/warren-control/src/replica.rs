//! Several `warren server` replicas on one database: all of them serve the
//! API, one of them leads. The leader holds a lease in the store and runs
//! the control plane (scheduler, queue, sweepers, node event followers);
//! every other replica forwards each request, streams and upgrades
//! included, to the leader it finds in the lease. A replica that becomes
//! leader starts its control plane as a restarted server would (recovery,
//! reconciliation with each node); one that loses the lease stops at once,
//! so two never place at the same time.

use std::sync::{Arc, OnceLock, RwLock};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower::ServiceExt;
use warren_core::{ApiError, ErrorCode};

/// The leader lease: held this long unless renewed (renewed every second;
/// a follower looks every half second, so a dead leader is replaced within
/// about four and a half seconds).
pub const LEASE_MS: i64 = 4000;

/// Serves as the leader once this replica leads, and forwards to the
/// leader until then.
pub struct Switch {
    own: OnceLock<Router>,
    leader_url: RwLock<Option<String>>,
    client: Client<HttpConnector, Body>,
}

impl Default for Switch {
    fn default() -> Self {
        Switch {
            own: OnceLock::new(),
            leader_url: RwLock::new(None),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

impl Switch {
    /// The router to serve: it dispatches to this replica's own control
    /// plane or to the leader's.
    pub fn router(self: &Arc<Self>) -> Router {
        // A create answered 503 while the leader is away leaves its body
        // unread, and the connection is then closed under the client: it
        // must be told, or its next request on that connection fails.
        Router::new()
            .fallback(dispatch)
            .layer(axum::middleware::from_fn(
                crate::api::close_after_unread_body,
            ))
            .with_state(self.clone())
    }

    /// This replica leads from now on: its own control plane answers.
    pub fn lead(&self, router: Router) {
        let _ = self.own.set(router);
    }

    pub fn leads(&self) -> bool {
        self.own.get().is_some()
    }

    /// Where requests go while another replica leads.
    pub fn follow(&self, url: &str) {
        *warren_core::sync::write(&self.leader_url) = Some(url.trim_end_matches('/').to_string());
    }
}

async fn dispatch(State(sw): State<Arc<Switch>>, req: Request) -> Response {
    if let Some(own) = sw.own.get() {
        return match own.clone().oneshot(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
    }
    let leader = warren_core::sync::read(&sw.leader_url).clone();
    match leader {
        Some(base) => forward(&sw, &base, req).await,
        None => unavailable("no replica leads yet; retry in a moment"),
    }
}

fn unavailable(message: &str) -> Response {
    let e = ApiError {
        code: ErrorCode::Unavailable,
        message: message.to_string(),
        retry_after_ms: Some(1000),
    };
    let mut resp = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(e.body())).into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// Sends `req` to the leader at `base` and answers what it answers, the
/// body streamed both ways; an upgraded connection (a port tunnel) is
/// spliced through.
async fn forward(sw: &Switch, base: &str, mut req: Request) -> Response {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let Ok(uri) = format!("{base}{path}").parse::<Uri>() else {
        return unavailable(&format!("the leader's address {base:?} is not a URL"));
    };
    *req.uri_mut() = uri;
    req.headers_mut().remove(header::HOST);
    let upgrading = req.headers().contains_key(header::UPGRADE);
    let downstream = upgrading.then(|| hyper::upgrade::on(&mut req));
    let mut resp = match sw.client.request(req).await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::warn!(leader = %base, error = %e, "forwarding to the leader");
            return unavailable(&format!(
                "the leading replica {base} did not answer ({e}); retry in a moment"
            ));
        }
    };
    if let (StatusCode::SWITCHING_PROTOCOLS, Some(downstream)) = (resp.status(), downstream) {
        let upstream = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            let (Ok(down), Ok(up)) = (downstream.await, upstream.await) else {
                return;
            };
            let (mut down, mut up) = (TokioIo::new(down), TokioIo::new(up));
            let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
        });
    }
    resp.map(Body::new)
}

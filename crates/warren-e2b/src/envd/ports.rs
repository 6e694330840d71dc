//! `E2b-Sandbox-Port` other than envd's: the request goes to that port on
//! the sandbox's loopback (how `e2b_code_interpreter` reaches the Jupyter
//! server in its template), with E2B's routing headers and every
//! credential taken off (E2B's tokens, an `Authorization`, cookies: the
//! sandbox's code is not to see them).

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::Response;
use warren_control::Control;

/// `host`: the Host the sandbox's server sees (E2B's `maskRequestHost`, or
/// the `PORT-ID.DOMAIN` a request was routed by, as E2B's proxy passes it
/// on); None: `localhost`.
pub async fn forward(
    control: &Control,
    id: &str,
    port: u16,
    mut req: Request,
    host: Option<String>,
) -> Response {
    let host = host.and_then(|h| axum::http::HeaderValue::from_str(&h).ok());
    for h in [
        "e2b-sandbox-id",
        "e2b-sandbox-port",
        "x-access-token",
        "e2b-traffic-access-token",
        "authorization",
        "cookie",
    ] {
        req.headers_mut().remove(h);
    }
    match control.io().forward_http(id, port, req, host).await {
        Ok(resp) => resp,
        // E2B's proxy says "port is not open", which the SDK recognises.
        Err(e) => super::plain_error(
            StatusCode::BAD_GATEWAY,
            format!(
                "The sandbox is running but port is not open: port {port} in sandbox {id} ({})",
                e.message
            ),
        ),
    }
}

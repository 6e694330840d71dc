//! What each E2B control route lets a tenant's key do, in one table (the
//! API's rules, `warren_control::access`, applied to E2B's paths). A route
//! missing here is the operator's alone. Envd traffic needs no rule: each
//! sandbox's access token is given only to whoever made or connected to it.

use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use warren_control::access::{path_key, Access, Call, Kind, Rule};
use warren_core::tenant::Principal;

use crate::api::St;
use crate::reply::{control, E2bError};

use Access::{Change, Read};
use Kind::{Sandbox, Secret, Volume};
use Rule::{Owned, Tenant};

/// The rule of an E2B route, by method and pattern.
pub(crate) fn rule(method: &Method, path: &str) -> Option<Rule> {
    let get = method == Method::GET;
    Some(match (path, get) {
        ("/sandboxes", true) | ("/v2/sandboxes", true) => Tenant(Read),
        ("/sandboxes", false) | ("/v2/sandboxes", false) => Tenant(Change),
        ("/sandboxes/{id}", true) | ("/sandboxes/{id}/metrics", _) => Owned(Sandbox, Read),
        ("/sandboxes/{id}", false)
        | ("/sandboxes/{id}/connect", _)
        | ("/v2/sandboxes/{id}/connect", _)
        | ("/sandboxes/{id}/resume", _)
        | ("/sandboxes/{id}/timeout", _)
        | ("/sandboxes/{id}/pause", _)
        | ("/sandboxes/{id}/network", _)
        | ("/sandboxes/{id}/fork", _) => Owned(Sandbox, Change),
        ("/templates/aliases/{alias}", true) => Tenant(Read),
        ("/secrets", true) => Tenant(Read),
        ("/secrets", false) => Tenant(Change),
        ("/secrets/{id}", true) => Owned(Secret, Read),
        ("/secrets/{id}", false) => Owned(Secret, Change),
        ("/volumes", true) => Tenant(Read),
        ("/volumes", false) => Tenant(Change),
        ("/volumes/{id}", true) => Owned(Volume, Read),
        ("/volumes/{id}", false) => Owned(Volume, Change),
        // Templates and snapshots are their tenant's (see
        // `template_builds`): each handler finds only what its caller
        // reaches, and their images are owned as any image is.
        ("/sandboxes/{id}/snapshots", _) => Owned(Sandbox, Change),
        ("/snapshots", _) | ("/templates/{tid}/builds/{bid}/status", _) => Tenant(Read),
        ("/templates/{id}", _)
        | ("/v3/templates", _)
        | ("/templates/{tid}/files/{hash}", _)
        | ("/v2/templates/{tid}/builds/{bid}", _) => Tenant(Change),
        _ => return None,
    })
}

/// Checks the key (E2B's `X-API-KEY`: Warren's operator token or a
/// tenant's token, bare or as `e2b_<token>`) and sets the caller.
pub(crate) async fn auth(State(e2b): St, mut req: Request, next: Next) -> Response {
    let key = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let key = key.strip_prefix("e2b_").unwrap_or(key).to_string();
    let control = match control(&e2b) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    match control.tenants().authenticate(&key).await {
        Ok(Some(who)) => {
            req.extensions_mut().insert(who);
            next.run(req).await
        }
        Ok(None) => E2bError::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key: set E2B_API_KEY to Warren's API token (<home>/token) or a tenant's token (`warren token create`), bare or as e2b_<token>",
        )
        .into_response(),
        Err(e) => E2bError::from(e).into_response(),
    }
}

/// Applies [`rule`] after routing.
pub(crate) async fn gate(
    State(e2b): St,
    matched: MatchedPath,
    params: RawPathParams,
    req: Request,
    next: Next,
) -> Response {
    let Some(who) = req.extensions().get::<Principal>().cloned() else {
        return E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, "no caller").into_response();
    };
    let key = path_key(&params);
    let control = match control(&e2b) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let (method, route) = (req.method().clone(), matched.as_str().to_string());
    let call = Call {
        who: &who,
        door: "e2b",
        method: &method,
        route: &route,
        key: &key,
    };
    let rule = rule(&method, &route);
    // An E2B client asking for another tenant's sandbox reads E2B's own
    // "not found".
    control
        .gate()
        .gated(call, rule, next.run(req), |e| {
            E2bError::from(e).into_response()
        })
        .await
}

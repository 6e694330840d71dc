//! What each route of the API lets a tenant's token do, in one table, and
//! the gate that applies it after routing. A route missing from the table
//! is the operator's alone, so a new route is closed to tenants until it is
//! declared here (a test checks every documented route is).

use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use warren_core::tenant::Principal;

use super::{Failure, St};
use crate::access::{path_key, Access, Call, Kind, Rule};

use Access::{Change, Read};
use Kind::*;
use Rule::{Operator, Owned as Own, Tenant};

/// The rule of a route, by method and the route's pattern; None: not
/// declared (the operator's only).
pub(crate) fn rule(method: &Method, path: &str) -> Option<Rule> {
    let get = method == Method::GET || method == Method::HEAD;
    let rule = match (path, get) {
        ("/openapi.json", true) | ("/v1/whoami", true) | ("/v1/audit", true) => Tenant(Read),
        ("/v1/sandboxes", true) => Tenant(Read),
        ("/v1/sandboxes", false) => Tenant(Change),
        ("/v1/run", false) => Tenant(Change),
        ("/v1/sandboxes/{id}", true)
        | ("/v1/sandboxes/{id}/files", true)
        | ("/v1/sandboxes/{id}/logs", true)
        | ("/v1/sandboxes/{id}/watch", true) => Own(Sandbox, Read),
        // A WebSocket exec, a port's link and a port's traffic are GETs that
        // reach into the sandbox: changes.
        ("/v1/sandboxes/{id}", false)
        | ("/v1/sandboxes/{id}/exec", _)
        | ("/v1/sandboxes/{id}/exec/ws", _)
        | ("/v1/sandboxes/{id}/execs/{exec_id}/stdin", _)
        | ("/v1/sandboxes/{id}/execs/{exec_id}/resize", _)
        | ("/v1/sandboxes/{id}/heartbeat", _)
        | ("/v1/sandboxes/{id}/pause", _)
        | ("/v1/sandboxes/{id}/resume", _)
        | ("/v1/sandboxes/{id}/ttl", _)
        | ("/v1/sandboxes/{id}/reclaim", _)
        | ("/v1/sandboxes/{id}/fork", _)
        | ("/v1/sandboxes/{id}/files", false)
        | ("/v1/sandboxes/{id}/paths", _)
        | ("/v1/sandboxes/{id}/network", _)
        | ("/v1/sandboxes/{id}/ports/{port}", _)
        | ("/v1/sandboxes/{id}/ports/{port}/", _)
        | ("/v1/sandboxes/{id}/ports/{port}/{*path}", _) => Own(Sandbox, Change),
        ("/v1/events", true) | ("/v1/usage", true) | ("/v1/fleet", true) | ("/v1/logs", true) => {
            Tenant(Read)
        }
        ("/v1/batches", true) => Tenant(Read),
        ("/v1/batches", false) => Tenant(Change),
        ("/v1/batches/{id}", true) => Own(Batch, Read),
        ("/v1/batches/{id}", false) => Own(Batch, Change),
        ("/v1/pools", true) => Tenant(Read),
        ("/v1/pools/{name}", true) => Own(Pool, Read),
        ("/v1/pools/{name}", false) => Own(Pool, Change),
        ("/v1/secrets", true) => Tenant(Read),
        ("/v1/secrets", false) => Tenant(Change),
        ("/v1/secrets/{name}", true) => Own(Secret, Read),
        ("/v1/secrets/{name}", false) => Own(Secret, Change),
        // A tenant's images are its own (see `images::owners`): the
        // service checks each name.
        ("/v1/images", true) => Tenant(Read),
        ("/v1/images/import", _) | ("/v1/images/pull", _) | ("/v1/images/{*reference}", _) => {
            Tenant(Change)
        }
        ("/v1/builds", _) => Tenant(Change),
        ("/v1/builds/{id}", _) => Tenant(Read),
        ("/v1/sandboxes/{id}/commit", _) => Own(Sandbox, Change),
        ("/v1/volumes", true) => Tenant(Read),
        ("/v1/volumes", false) => Tenant(Change),
        ("/v1/volumes/{name}", _) => Own(Volume, Change),
        ("/v1/tenants", true) | ("/v1/tenants/{name}", true) => Tenant(Read),
        ("/v1/tokens", _) | ("/v1/tokens/{id}", _) => Tenant(Read),
        // The operator's: pushing into the cluster's registries, image
        // collection and prewarming (every node's disk), nodes, metrics,
        // the history (the queue and node CPU of every tenant) and
        // profiles (shared learning).
        ("/v1/images/push", _)
        | ("/v1/images/gc", _)
        | ("/v1/images/prewarm", _)
        | ("/v1/profiles", _)
        | ("/v1/profiles/export", _)
        | ("/v1/profiles/import", _)
        | ("/v1/profiles/{name}", _)
        | ("/v1/profiles/{name}/reset", _)
        | ("/v1/nodes", _)
        | ("/v1/history", _)
        | ("/v1/nodes/{name}", _)
        | ("/v1/nodes/{name}/cordon", _)
        | ("/v1/nodes/{name}/uncordon", _)
        | ("/v1/nodes/{name}/drain", _)
        | ("/v1/tenants", _)
        | ("/v1/tenants/{name}", _)
        | ("/metrics", _) => Operator,
        _ => return None,
    };
    Some(rule)
}

/// Applies [`rule`] to a routed request (a `route_layer`, so the route's
/// pattern and parameters are known).
pub(crate) async fn gate(
    State(st): St,
    matched: MatchedPath,
    params: RawPathParams,
    req: Request,
    next: Next,
) -> Response {
    let Some(who) = req.extensions().get::<Principal>().cloned() else {
        return Failure(warren_core::ApiError::internal(
            "no caller on a routed request",
        ))
        .into_response();
    };
    let key = path_key(&params);
    let (method, route) = (req.method().clone(), matched.as_str().to_string());
    let call = Call {
        who: &who,
        door: "api",
        method: &method,
        route: &route,
        key: &key,
    };
    let rule = rule(&method, &route);
    st.control
        .gate()
        .gated(call, rule, next.run(req), |e| Failure(e).into_response())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use utoipa::OpenApi;

    /// Every documented route has a declared rule: none is left to the
    /// default by oversight.
    #[test]
    fn every_route_is_declared() {
        let doc = super::super::ApiDoc::openapi();
        for (path, item) in doc.paths.paths {
            let methods = [
                (Method::GET, item.get.is_some()),
                (Method::POST, item.post.is_some()),
                (Method::PUT, item.put.is_some()),
                (Method::PATCH, item.patch.is_some()),
                (Method::DELETE, item.delete.is_some()),
            ];
            // OpenAPI writes a route's trailing wildcard `{*x}` as `{x}`.
            let routed = match path.rsplit_once("/{") {
                Some((head, last)) if rule(&Method::GET, &path).is_none() => {
                    format!("{head}/{{*{last}")
                }
                _ => path.clone(),
            };
            for (m, present) in methods {
                if present && path != "/healthz" {
                    assert!(rule(&m, &routed).is_some(), "{m} {path} has no rule");
                }
            }
        }
    }

    #[test]
    fn sandbox_routes_check_the_owner_and_gets_that_reach_in_are_changes() {
        assert_eq!(
            rule(&Method::GET, "/v1/sandboxes/{id}/exec/ws"),
            Some(Own(Sandbox, Change))
        );
        assert_eq!(
            rule(&Method::GET, "/v1/sandboxes/{id}/logs"),
            Some(Own(Sandbox, Read))
        );
        assert_eq!(rule(&Method::GET, "/v1/nodes"), Some(Operator));
        assert_eq!(rule(&Method::GET, "/v1/made-up"), None);
    }
}

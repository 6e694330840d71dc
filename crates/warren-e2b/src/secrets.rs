//! E2B's secrets API (`Secret.create`, `list`, `get_info`, `update`,
//! `exists`, `destroy`) on Warren's secrets, and how an E2B sandbox is given
//! one. E2B resolves a secret at the sandbox's egress, into the headers of
//! requests that match `network.rules` (TLS interception); Warren gives it
//! to the sandbox instead: an `envVars` entry whose value is exactly
//! `Secret.fill(name)` (`${e2b.secrets.NAME}`) becomes that secret as the
//! variable, and egress header rules are refused (400) rather than
//! ignored.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use warren_core::secret::{
    EnvName, SecretInfo, SecretMetadata, SecretName, SecretRef, SecretRequest, SecretValue,
};
use warren_core::SandboxSpec;

use crate::reply::{body, control, E2bError, E2bResult};
use crate::E2b;

type St = State<Arc<E2b>>;

/// What `Secret.fill(name)` writes: `${e2b.secrets.NAME}`.
const FILL_OPEN: &str = "${e2b.secrets.";
const FILL_CLOSE: &str = "}";

/// A page of a list holds 100 secrets unless asked, at most 100.
const MAX_PAGE: i64 = 100;

/// The routes (behind the API key).
pub fn routes() -> Router<Arc<E2b>> {
    Router::new()
        .route("/secrets", get(list).post(create))
        .route("/secrets/{id}", get(one).post(update).delete(destroy))
}

fn bad(message: impl Into<String>) -> E2bError {
    E2bError::new(StatusCode::BAD_REQUEST, message)
}

/// E2B's `Secret`: metadata only, never the value.
fn secret(s: &SecretInfo) -> Value {
    json!({
        "secretID": s.id,
        "name": s.name,
        "currentVersion": s.version,
        "metadata": s.metadata,
        "createdAt": s.created_at,
        "updatedAt": s.updated_at,
    })
}

fn metadata(m: Option<BTreeMap<String, String>>) -> E2bResult<Option<SecretMetadata>> {
    m.map(SecretMetadata::try_from)
        .transpose()
        .map_err(|e| bad(e.to_string()))
}

fn value(v: String) -> E2bResult<SecretValue> {
    SecretValue::try_from(v).map_err(|e| bad(e.to_string()))
}

#[derive(Deserialize)]
struct NewSecret {
    name: String,
    value: String,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

async fn create(
    State(e2b): St,
    axum::Extension(who): axum::Extension<warren_core::tenant::Principal>,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: NewSecret = body(&raw)?;
    let req = SecretRequest {
        name: SecretName::try_from(req.name).map_err(|e| bad(e.to_string()))?,
        value: value(req.value)?,
        metadata: metadata(req.metadata)?,
    };
    let made = control(&e2b)?.secrets().create(&who, req).await?;
    Ok((StatusCode::CREATED, Json(secret(&made))).into_response())
}

#[derive(Deserialize)]
struct SecretUpdate {
    value: String,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

/// `POST /secrets/{id}`: a new version; metadata replaced when given.
async fn update(State(e2b): St, Path(id): Path<String>, raw: Bytes) -> E2bResult<Json<Value>> {
    let req: SecretUpdate = body(&raw)?;
    let (value, metadata) = (value(req.value)?, metadata(req.metadata)?);
    let updated = control(&e2b)?
        .secrets()
        .update(&id, value, metadata)
        .await?;
    Ok(Json(secret(&updated)))
}

async fn one(State(e2b): St, Path(id): Path<String>) -> E2bResult<Json<Value>> {
    Ok(Json(secret(&control(&e2b)?.secrets().get(&id).await?)))
}

async fn destroy(State(e2b): St, Path(id): Path<String>) -> E2bResult<StatusCode> {
    control(&e2b)?.secrets().delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    limit: Option<i64>,
    next_token: Option<String>,
}

/// Where a page starts: after the secret (by creation time, then id) the
/// cursor names, so a secret removed between two pages moves nothing.
fn cursor(s: &SecretInfo) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{}\n{}", s.created_at, s.id))
}

fn after_cursor(token: &str) -> E2bResult<(String, String)> {
    let bad_token = || bad(format!("nextToken {token:?} is not one this server gave"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad_token())?;
    let text = String::from_utf8(raw).map_err(|_| bad_token())?;
    let (at, id) = text.split_once('\n').ok_or_else(bad_token)?;
    Ok((at.to_string(), id.to_string()))
}

/// A page of secrets, oldest first: `limit` (1 to 100, 100 unless given)
/// after `nextToken`, and `X-Next-Token` only when more follow.
async fn list(
    State(e2b): St,
    axum::Extension(who): axum::Extension<warren_core::tenant::Principal>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> E2bResult<Response> {
    let Query(q) = q.map_err(|e| bad(format!("query: {e}")))?;
    let limit = q.limit.unwrap_or(MAX_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(bad(format!("limit {limit}: 1 to {MAX_PAGE}")));
    }
    let mut all = control(&e2b)?.secrets().list(&who).await?;
    all.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
    let start = match q.next_token.as_deref().filter(|t| !t.is_empty()) {
        None => 0,
        Some(t) => {
            let (at, id) = after_cursor(t)?;
            all.iter()
                .position(|s| (&s.created_at, &s.id) > (&at, &id))
                .unwrap_or(all.len())
        }
    };
    let page: Vec<&SecretInfo> = all.iter().skip(start).take(limit as usize).collect();
    let more = start + page.len() < all.len();
    let mut resp = Json(page.iter().map(|s| secret(s)).collect::<Vec<_>>()).into_response();
    if let Some(last) = page.last().filter(|_| more) {
        if let Ok(v) = HeaderValue::from_str(&cursor(last)) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

/// The secret a whole `envVars` value names, when it is
/// `Secret.fill(name)`; an error when it names one inside other text
/// (Warren gives a secret as a whole variable, and does not substitute
/// one into other text).
fn filled(var: &str, value: &str) -> E2bResult<Option<SecretName>> {
    if !value.contains(FILL_OPEN) {
        return Ok(None);
    }
    let name = value
        .strip_prefix(FILL_OPEN)
        .and_then(|rest| rest.strip_suffix(FILL_CLOSE))
        .filter(|name| !name.contains(FILL_CLOSE));
    let Some(name) = name else {
        return Err(bad(format!(
            "envVars {var:?}: a secret fills a whole variable here ({{\"{var}\": Secret.fill(\"name\")}}); Warren does not put one inside other text"
        )));
    };
    SecretName::try_from(name.to_string())
        .map(Some)
        .map_err(|e| bad(format!("envVars {var:?}: {e}")))
}

/// Moves the `envVars` entries that are `Secret.fill(name)` from the
/// spec's environment to its secrets (that secret as that variable), so
/// the spec holds the name and never the value.
pub(crate) fn take_fills(spec: &mut SandboxSpec) -> E2bResult<()> {
    let mut refs = Vec::new();
    for (var, value) in &spec.env {
        if let Some(name) = filled(var, value)? {
            let env = EnvName::try_from(var.clone())
                .map_err(|e| bad(format!("envVars {var:?} holds a secret, so: {e}")))?;
            refs.push(SecretRef {
                name,
                env: Some(env),
                target: None,
            });
        }
    }
    for r in &refs {
        if let Some(env) = &r.env {
            spec.env.remove(env.as_str());
        }
    }
    spec.secrets.extend(refs);
    Ok(())
}

/// Refuses E2B's egress transforms (`network.rules`, headers injected
/// into matching requests, typically with `Secret.fill` in them): they
/// need TLS interception at the egress proxy, which Warren does not do.
/// Refused rather than ignored, so that no request goes out without the
/// header its code expects.
pub(crate) fn refuse_transforms(raw: &[u8], network_at: &str) -> E2bResult<()> {
    let Ok(v) = serde_json::from_slice::<Value>(raw) else {
        return Ok(()); // the route's own parse says what is wrong
    };
    let Some(rules) = v.pointer(network_at).and_then(|n| n.get("rules")) else {
        return Ok(());
    };
    let transforms = match rules {
        Value::Null => false,
        Value::Object(hosts) => hosts.values().any(|list| match list {
            Value::Array(rules) => rules
                .iter()
                .any(|r| r.get("transform").is_some_and(|t| !t.is_null())),
            Value::Null => false,
            _ => true,
        }),
        _ => true,
    };
    if transforms {
        return Err(bad(
            "network.rules (headers injected into a sandbox's outgoing requests) is not supported by Warren: \
             it needs TLS interception at the egress proxy. Give the secret to the sandbox instead, as a \
             variable: envVars {\"API_KEY\": Secret.fill(\"name\")} (see docs/e2b.md#secrets)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_fill_placeholder_becomes_a_secret_variable() {
        let mut spec = SandboxSpec {
            env: [
                (
                    "API_KEY".to_string(),
                    "${e2b.secrets.OpenAI-Key}".to_string(),
                ),
                ("PLAIN".to_string(), "e2b.secrets".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        take_fills(&mut spec).expect("fills");
        assert_eq!(spec.env.keys().collect::<Vec<_>>(), ["PLAIN"]);
        assert_eq!(spec.secrets.len(), 1);
        assert_eq!(spec.secrets[0].name.as_str(), "openai-key");
        assert_eq!(
            spec.secrets[0].env.as_ref().map(EnvName::as_str),
            Some("API_KEY")
        );
        for (var, value) in [
            ("V", "Bearer ${e2b.secrets.k}"),
            ("V", "${e2b.secrets.k}${e2b.secrets.j}"),
            ("V", "${e2b.secrets.}"),
            ("V", "${e2b.secrets.a b}"),
            ("1V", "${e2b.secrets.k}"),
        ] {
            let mut spec = SandboxSpec {
                env: [(var.to_string(), value.to_string())].into(),
                ..Default::default()
            };
            assert!(take_fills(&mut spec).is_err(), "{var}={value}");
        }
    }

    #[test]
    fn egress_header_transforms_are_refused() {
        let body = |network: &str| format!(r#"{{"templateID":"base","network":{network}}}"#);
        let header = body(
            r#"{"allowOut":["api.example.com"],"rules":{"api.example.com":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.k}"}}}]}}"#,
        );
        assert!(refuse_transforms(header.as_bytes(), "/network").is_err());
        for fine in [
            body(r#"{"allowOut":["a.io"]}"#),
            body(r#"{"rules":{}}"#),
            body(r#"{"rules":null}"#),
            body(r#"{"rules":{"a.io":[]}}"#),
            r#"{"templateID":"base"}"#.to_string(),
        ] {
            assert!(
                refuse_transforms(fine.as_bytes(), "/network").is_ok(),
                "{fine}"
            );
        }
        let update = br#"{"rules":{"a.io":[{"transform":{"headers":{"X":"y"}}}]}}"#;
        assert!(refuse_transforms(update, "").is_err());
    }

    #[test]
    fn list_cursors_round_trip() {
        let s = SecretInfo {
            name: SecretName::try_from("k".to_string()).expect("name"),
            id: "sec_1".into(),
            version: 1,
            metadata: SecretMetadata::default(),
            created_at: "2026-01-01T00:00:00Z".into(),
            updated_at: "2026-01-01T00:00:00Z".into(),
        };
        assert_eq!(
            after_cursor(&cursor(&s)).expect("cursor"),
            (s.created_at.clone(), s.id.clone())
        );
        assert!(after_cursor("not a cursor!").is_err());
    }
}

//! The routes of E2B's template builds (see [`crate::template_builds`]).
//! All but the upload take the API key; an upload link is signed for its
//! files hash instead (the SDK sends it with no key, as it would to a
//! storage bucket).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use warren_core::tenant::Principal;

use crate::reply::{body, control, E2bError, E2bResult};
use crate::template_builds::TemplateBuildError;
use crate::E2b;

type St = State<Arc<E2b>>;

const UPLOAD: &str = "e2b-template-upload";
/// The largest upload of one `COPY`'s files.
const MAX_UPLOAD: u64 = 4 << 30;

/// The routes that take the API key.
pub fn routes() -> Router<Arc<E2b>> {
    Router::new()
        .route("/v3/templates", post(request_build))
        .route("/templates/{tid}/files/{hash}", get(upload_link))
        .route("/v2/templates/{tid}/builds/{bid}", post(start_build))
        .route("/templates/{tid}/builds/{bid}/status", get(status))
        .route("/templates/aliases/{alias}", get(alias))
}

/// The upload route: signed, no key.
pub fn upload_route() -> Router<Arc<E2b>> {
    Router::new()
        .route("/template-files/{hash}", put(upload))
        .layer(DefaultBodyLimit::disable())
}

impl From<TemplateBuildError> for E2bError {
    fn from(e: TemplateBuildError) -> Self {
        let status = match e {
            TemplateBuildError::Invalid(_) => StatusCode::BAD_REQUEST,
            TemplateBuildError::NotFound(_) => StatusCode::NOT_FOUND,
            TemplateBuildError::Taken(_) => StatusCode::CONFLICT,
            TemplateBuildError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        E2bError::new(status, e.to_string())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewTemplate {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    cpu_count: Option<u32>,
    #[serde(default, rename = "memoryMB")]
    memory_mb: Option<u64>,
}

async fn request_build(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: NewTemplate = body(&raw)?;
    let name = req
        .name
        .or(req.alias)
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| E2bError::new(StatusCode::BAD_REQUEST, "name is required"))?;
    if req.cpu_count == Some(0) || req.memory_mb == Some(0) {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "cpuCount and memoryMB must be above 0",
        ));
    }
    let (tid, bid) = e2b
        .builds
        .request(&who, &name, req.cpu_count, req.memory_mb)?;
    let tags = if req.tags.is_empty() {
        vec!["default".to_string()]
    } else {
        req.tags
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "templateID": tid, "buildID": bid, "public": false,
            "names": [name], "tags": tags, "aliases": [name],
        })),
    )
        .into_response())
}

async fn upload_link(
    State(e2b): St,
    Path((_tid, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> E2bResult<Response> {
    let present = e2b.builds.has_files(&hash)?;
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .ok_or_else(|| E2bError::new(StatusCode::BAD_REQUEST, "no Host header"))?;
    let token = e2b
        .signer
        .tag(UPLOAD, &[hash.as_bytes()], crate::TOKEN_BYTES);
    let url = format!("http://{host}/template-files/{hash}?token={token}");
    Ok((
        StatusCode::CREATED,
        Json(json!({"present": present, "url": url})),
    )
        .into_response())
}

#[derive(Deserialize)]
struct UploadQuery {
    token: String,
}

async fn upload(
    State(e2b): St,
    Path(hash): Path<String>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> E2bResult<Response> {
    if !e2b
        .signer
        .verify(UPLOAD, &[hash.as_bytes()], crate::TOKEN_BYTES, &q.token)
    {
        return Err(E2bError::new(
            StatusCode::FORBIDDEN,
            "the upload link is not valid for these files; ask GET /templates/{id}/files/{hash} for one",
        ));
    }
    let (tmp, path) = e2b.builds.upload_target(&hash)?;
    let written = async {
        use tokio::io::AsyncWriteExt;
        let mut file = tokio::fs::File::create(&tmp).await?;
        let mut stream = body.into_data_stream();
        let mut total = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(std::io::Error::other)?;
            total += chunk.len() as u64;
            if total > MAX_UPLOAD {
                return Err(std::io::Error::other(format!(
                    "the upload is larger than {} GiB",
                    MAX_UPLOAD >> 30
                )));
            }
            file.write_all(&chunk).await?;
        }
        file.sync_all().await?;
        tokio::fs::rename(&tmp, &path).await
    }
    .await;
    if let Err(e) = written {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("the upload broke off: {e}"),
        ));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The build is `who`'s tenant's, and so are its image (see the control
/// plane's `Images::claim`) and its warm pool.
async fn start_build(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    Path((tid, bid)): Path<(String, String)>,
    raw: Bytes,
) -> E2bResult<Response> {
    let def: crate::template_builds::Definition = body(&raw)?;
    let control = control(&e2b)?;
    // What the base image runs as: RUN steps with a user of their own go
    // back to it after.
    let images = control.images().list(&who).await.unwrap_or_default();
    let base_user = |name: &str| {
        images
            .iter()
            .find(|i| i.name == name || i.name.ends_with(&format!("/{name}")))
            .and_then(|i| i.record["config"]["user"].as_str().map(str::to_string))
            .filter(|u| !u.is_empty())
    };
    let prepared = e2b.builds.prepare(
        &who,
        &tid,
        &bid,
        &def,
        &base_user,
        &e2b.templates.build_allow(),
    )?;
    let context = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(
        prepared
            .context
            .try_clone()
            .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?,
    ))
    .map(|r| {
        r.map_err(|e| warren_core::ApiError::internal(format!("reading the build context: {e}")))
    })
    .boxed();
    let mut events = match control
        .start_build(&who, prepared.request.clone(), context)
        .await
    {
        Ok(events) => events,
        Err(e) => {
            e2b.builds.failed(&tid, &bid, e.message.clone());
            return Err(e.into());
        }
    };
    let runner = e2b.clone();
    tokio::spawn(async move {
        while let Some(event) = events.next().await {
            if let Some(built) = runner.builds.follow(&prepared, &event) {
                let note = warm_pool(&runner, &control, &who, &prepared, &built).await;
                runner.builds.ready(&prepared, built, note);
            }
        }
    });
    Ok((StatusCode::ACCEPTED, Json(json!({}))).into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusQuery {
    #[serde(default)]
    logs_offset: usize,
    #[serde(default)]
    limit: Option<usize>,
}

async fn status(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    Path((tid, bid)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> E2bResult<Response> {
    let p = e2b.builds.progress(&who, &tid, &bid)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 100);
    let entries: Vec<_> = p
        .entries
        .iter()
        .skip(q.logs_offset)
        .take(limit)
        .cloned()
        .collect();
    let logs: Vec<&str> = entries.iter().map(|e| e.message.as_str()).collect();
    let mut answer = json!({
        "templateID": tid, "buildID": bid, "status": p.status,
        "logs": logs, "logEntries": entries,
    });
    if let Some((message, step)) = p.reason {
        answer["reason"] = json!({"message": message, "step": step});
    }
    Ok(Json(answer).into_response())
}

async fn alias(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    Path(alias): Path<String>,
) -> E2bResult<Response> {
    let known: BTreeMap<&str, String> = match e2b.builds.get(&who, &alias) {
        Some(b) => [("templateID", b.template_id)].into_iter().collect(),
        None if e2b.templates.has_alias(&alias) => {
            [("templateID", alias.clone())].into_iter().collect()
        }
        None => {
            return Err(E2bError::new(
                StatusCode::NOT_FOUND,
                format!("no template {alias:?}"),
            ))
        }
    };
    Ok(Json(json!({"templateID": known["templateID"], "public": false})).into_response())
}

/// How long a build's end waits for its warm pool's first members.
const POOL_WARM_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// A template with a start command keeps a warm pool of sandboxes already
/// running it (E2B's snapshot of a started template): set, or replaced
/// for the new image, and waited for. What to say of it in the log.
async fn warm_pool(
    e2b: &E2b,
    control: &Arc<warren_control::Control>,
    who: &Principal,
    prepared: &crate::template_builds::Prepared,
    built: &crate::template_builds::Built,
) -> Option<String> {
    let size = e2b.templates.warm_pool();
    let template = built.template();
    let name = e2b.builds.pool_name(prepared);
    if template.cmd.is_none() || size == 0 {
        // No server to keep started (or no pool wanted): none kept.
        let _ = control.delete_pool(&name).await;
        return None;
    }
    let spec = warren_core::pool::PoolSpec {
        image: template.image.clone(),
        cpu: template
            .cpu
            .as_deref()
            .and_then(|c| serde_json::from_value(json!(c)).ok()),
        memory: template
            .memory
            .as_deref()
            .and_then(|m| serde_json::from_value(json!(m)).ok()),
        cpu_request: None,
        memory_request: None,
        pids: None,
        cmd: template.cmd.clone(),
        isolation: template.isolation,
        size,
    };
    // The template's tenant's, as the template.
    if let Err(e) = control.set_pool(who, &name, spec).await {
        return Some(format!("warm pool {name} not kept: {}", e.message));
    }
    let deadline = tokio::time::Instant::now() + POOL_WARM_WITHIN;
    loop {
        let ready = control.pools().info(&name).map(|p| p.ready).unwrap_or(0);
        if ready >= size {
            return Some(format!("warm pool {name}: {ready} started sandboxes"));
        }
        if tokio::time::Instant::now() >= deadline {
            return Some(format!(
                "warm pool {name}: {ready} of {size} started so far"
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

//! E2B's forks and snapshots, on Warren's own: `fork` makes running
//! copies of a sandbox (its filesystem now, its main process started
//! anew), and a snapshot is the sandbox's filesystem committed as an image
//! that `Sandbox.create(snapshot_id)` (or one of its names) starts from,
//! kept with the built templates until `delete_snapshot`. Warren carries
//! files over, not processes or memory (docs/e2b.md says so).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use warren_core::image::{CommitImage, ImageTarget};
use warren_core::spec::ForkRequest;
use warren_core::tenant::Principal;

use crate::api::{live, sandbox, template_of, ttl};
use crate::reply::{body, control, page, E2bError, E2bResult};
use crate::template_builds::{Built, SnapshotOf};
use crate::E2b;

type St = State<Arc<E2b>>;

/// The repository snapshots' images are named in.
const SNAPSHOT_REPO: &str = "e2b-snapshot";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Fork {
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    count: Option<u32>,
}

/// `POST /sandboxes/{id}/fork`: `count` children, each with `timeout`; all
/// or none (a failure is the request's, not one child's).
pub(crate) async fn fork(
    State(e2b): St,
    Path(id): Path<String>,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: Fork = body(&raw)?;
    let count = req.count.unwrap_or(1);
    let control = control(&e2b)?;
    live(&control, &id).await?;
    let fork = ForkRequest {
        count,
        ttl: req.timeout.map(ttl).transpose()?,
        ..Default::default()
    };
    let children = control.fork(&id, fork).await?;
    let results: Vec<Value> = children
        .iter()
        .map(|child| json!({"sandbox": sandbox(&e2b, child)}))
        .collect();
    Ok((StatusCode::CREATED, Json(results)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NewSnapshot {
    #[serde(default)]
    name: Option<String>,
}

/// `POST /sandboxes/{id}/snapshots`: the sandbox's filesystem as an image
/// (a running sandbox is frozen while its layer is written), started by
/// its id or name with the source's template settings (start command,
/// sizes).
pub(crate) async fn create(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: NewSnapshot = body(&raw)?;
    let name = req.name.filter(|n| !n.trim().is_empty());
    if let Some(n) = &name {
        let ok = n.len() <= 128
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !ok {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("snapshot name {n:?}: up to 128 letters, digits, `.`, `_` and `-`"),
            ));
        }
        if e2b
            .builds
            .get(&who, n)
            .is_some_and(|b| b.snapshot.is_none())
        {
            return Err(E2bError::new(
                StatusCode::CONFLICT,
                format!("{n:?} names a template; give the snapshot another name"),
            ));
        }
    }
    let control = control(&e2b)?;
    let info = live(&control, &id).await?;
    let snapshot_id = warren_control::new_id_with("snap");
    let image = format!("{SNAPSHOT_REPO}/{snapshot_id}:latest");
    let committed = control
        .commit(
            &who,
            &id,
            CommitImage {
                into: ImageTarget::Name(image.clone()),
                created_by: Some(format!("E2B snapshot of {id}")),
            },
        )
        .await?;
    // A snapshot of a built template's sandbox starts as that template's.
    let source = e2b.builds.get(&who, &template_of(&info));
    let names: Vec<String> = name.into_iter().collect();
    let built = Built {
        template_id: snapshot_id.clone(),
        image,
        digest: Some(committed.digest),
        start_cmd: source.as_ref().and_then(|b| b.start_cmd.clone()),
        ready_cmd: source.as_ref().and_then(|b| b.ready_cmd.clone()),
        cpu: source.as_ref().and_then(|b| b.cpu),
        memory_mb: source.as_ref().and_then(|b| b.memory_mb),
        snapshot: Some(SnapshotOf {
            sandbox_id: id.clone(),
            names: names.clone(),
            created_at: warren_core::clock::now_rfc3339(),
        }),
        tenant: who.tenant(),
    };
    // A name moves to the newest snapshot given it.
    for n in &names {
        if let Some(older) = e2b.builds.get(&who, n).filter(|b| b.tenant == who.tenant()) {
            e2b.builds.remove(&who, &older.template_id)?;
        }
    }
    e2b.builds.keep_snapshot(built)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"snapshotID": snapshot_id, "names": names})),
    )
        .into_response())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListSnapshots {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

/// `GET /snapshots`: newest first, of one sandbox or by a name if asked.
pub(crate) async fn list(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    Query(q): Query<ListSnapshots>,
) -> E2bResult<Response> {
    let mut all = e2b.builds.snapshots(&who);
    all.reverse();
    all.retain(|b| {
        let Some(s) = &b.snapshot else { return false };
        q.sandbox_id
            .as_deref()
            .is_none_or(|id| id.is_empty() || s.sandbox_id == id)
            && q.name
                .as_deref()
                .is_none_or(|n| n.is_empty() || s.names.iter().any(|x| x == n))
    });
    Ok(page(
        &all,
        |b| b.template_id.clone(),
        q.next_token.as_deref(),
        q.limit,
        |b| {
            json!({
                "snapshotID": b.template_id,
                "names": b.snapshot.as_ref().map(|s| s.names.clone()).unwrap_or_default(),
            })
        },
    ))
}

/// `DELETE /templates/{id}` (what `delete_snapshot` calls): the template
/// or snapshot is forgotten and its image removed; while a sandbox still
/// runs from it, 409 and nothing changes.
pub(crate) async fn delete(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let Some(found) = e2b.builds.get(&who, &id) else {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("template or snapshot {id:?} not found"),
        ));
    };
    let control = control(&e2b)?;
    match control.images().remove(&who, &found.image).await {
        Ok(_) => {}
        // Removed by hand already: only the record is left.
        Err(e) if e.code == warren_core::ErrorCode::NotFound => {}
        Err(e) if e.code == warren_core::ErrorCode::Conflict => {
            return Err(E2bError::new(
                StatusCode::CONFLICT,
                format!("{id} is in use: {}", e.message),
            ))
        }
        Err(e) => return Err(e.into()),
    }
    e2b.builds.remove(&who, &found.template_id)?;
    Ok(StatusCode::NO_CONTENT)
}

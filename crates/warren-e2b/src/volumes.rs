//! E2B's volumes on Warren's: the control routes (`Volume.create`, `list`,
//! `get_info`, `connect`, `destroy`, behind the API key), the volume
//! content API (`/volumecontent/{volumeID}/{path|dir|file}`, behind the
//! volume's own token: what `vol.write_file`, `read_file`, `list`,
//! `make_dir`, `get_info`, `update_metadata` and `remove` call, with
//! `E2B_VOLUME_API_URL` pointed at this listener), and `volumeMounts` in a
//! sandbox create.
//!
//! An E2B volume is the Warren volume of the same name: its `volumeID` is
//! that name, so `volumeMounts` (by name) and the content API (by id) name
//! it alike. Warren's names are lowercase; an E2B name with capitals is
//! refused, saying so. A volume made here is [`DEFAULT_SIZE`] (E2B's
//! create names no size).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use warren_control::VolumeFiles;
use warren_core::files::{FileKind, Owner, PathEntry, PathKind, PathOp, VolumeWrite, WriteFile};
use warren_core::tenant::Principal;
use warren_core::volume::{
    MountPath, VolumeInfo, VolumeMount, VolumeName, VolumeRequest, VolumeSize,
};
use warren_core::{ApiError, ErrorCode, SandboxInfo, SandboxSpec};

use crate::reply::{body, control, E2bError, E2bResult};
use crate::{E2b, TOKEN_BYTES};

type St = State<Arc<E2b>>;

/// The size of a volume made through E2B's API (which names none): 1 GiB,
/// a sparse file until written. `warren volume create NAME --size SIZE`
/// makes one of another size that E2B's SDK then uses by its name.
pub const DEFAULT_SIZE: u64 = 1 << 30;

const VOLUME_ACCESS: &str = "e2b-volume-access";

/// The ids a file given to a sandbox may have (a sandbox's user namespace
/// maps 65536).
const MAX_ID: u32 = 65535;

impl E2b {
    /// The volume's content token: a MAC of its name and creation time
    /// under the API token. It needs no storage, does not expire, and is
    /// worthless for any other volume, including a later one of the same
    /// name (removing a volume revokes its token).
    pub fn volume_token(&self, v: &VolumeInfo) -> String {
        self.signer.tag(
            VOLUME_ACCESS,
            &[v.name.as_str().as_bytes(), v.created_at.as_bytes()],
            TOKEN_BYTES,
        )
    }

    fn volume_token_ok(&self, v: &VolumeInfo, token: &str) -> bool {
        self.signer.verify(
            VOLUME_ACCESS,
            &[v.name.as_str().as_bytes(), v.created_at.as_bytes()],
            TOKEN_BYTES,
            token,
        )
    }
}

/// The control routes (behind the API key).
pub fn routes() -> Router<Arc<E2b>> {
    Router::new()
        .route("/volumes", get(list).post(create))
        .route("/volumes/{id}", get(one).delete(destroy))
}

/// The content routes (behind each volume's token).
pub fn content_routes() -> Router<Arc<E2b>> {
    Router::new()
        .route(
            "/volumecontent/{id}/path",
            get(stat).patch(set_attrs).delete(remove),
        )
        .route("/volumecontent/{id}/dir", get(list_dir).post(make_dir))
        .route("/volumecontent/{id}/file", get(read_file).put(write_file))
        .layer(DefaultBodyLimit::disable())
}

/// A volume named as E2B names it: E2B's pattern, then Warren's (which
/// is lowercase).
fn e2b_name(name: &str) -> E2bResult<VolumeName> {
    let e2b_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'));
    if !e2b_ok {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("volume name {name:?}: letters, digits, `-` and `_` (E2B's ^[a-zA-Z0-9_-]+$)"),
        ));
    }
    VolumeName::try_from(name.to_string()).map_err(|_| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "volume name {name:?}: Warren's volume names are 1 to 63 lowercase letters, digits, `-` and `_`, \
                 starting with a letter or digit (an E2B name with capitals is not taken: use {:?})",
                name.to_ascii_lowercase()
            ),
        )
    })
}

/// A volume of `who`'s by the id in a path: 404 for one no volume can
/// have, or another tenant's.
async fn lookup(e2b: &E2b, who: &Principal, id: &str) -> E2bResult<VolumeInfo> {
    let missing = || E2bError::new(StatusCode::NOT_FOUND, format!("volume {id:?} not found"));
    let name = VolumeName::try_from(id.to_string()).map_err(|_| missing())?;
    control(e2b)?.volumes().info(who, &name).await.map_err(|e| {
        if e.code == ErrorCode::NotFound {
            missing()
        } else {
            e.into()
        }
    })
}

fn with_token(e2b: &E2b, v: &VolumeInfo) -> Value {
    json!({"volumeID": v.name, "name": v.name, "token": e2b.volume_token(v)})
}

#[derive(Deserialize)]
struct NewVolume {
    name: String,
}

async fn create(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: NewVolume = body(&raw)?;
    let name = e2b_name(&req.name)?;
    let size = VolumeSize::try_from(warren_core::spec::ByteSize(DEFAULT_SIZE))
        .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let made = control(&e2b)?
        .volumes()
        .create(
            &who,
            VolumeRequest {
                name,
                size,
                node_selector: Default::default(),
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(with_token(&e2b, &made))).into_response())
}

async fn list(State(e2b): St, Extension(who): Extension<Principal>) -> E2bResult<Json<Value>> {
    let all = control(&e2b)?.volumes().list(&who).await?;
    Ok(Json(
        all.iter()
            .map(|v| json!({"volumeID": v.name, "name": v.name}))
            .collect(),
    ))
}

async fn one(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> E2bResult<Json<Value>> {
    let v = lookup(&e2b, &who, &id).await?;
    Ok(Json(with_token(&e2b, &v)))
}

/// Removes a volume and its files (409 while a sandbox mounts it).
async fn destroy(
    State(e2b): St,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let v = lookup(&e2b, &who, &id).await?;
    control(&e2b)?.volumes().remove(&who, &v.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct E2bMount {
    name: String,
    path: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mounts {
    #[serde(default)]
    volume_mounts: Option<Vec<E2bMount>>,
}

/// A create's `volumeMounts` (`[{name, path}]`, read-write) as the spec's
/// volumes; a volume that does not exist (or is another tenant's) is 404
/// before anything is made.
pub(crate) async fn take_mounts(
    e2b: &E2b,
    who: &Principal,
    raw: &[u8],
    spec: &mut SandboxSpec,
) -> E2bResult<()> {
    let raw: &[u8] = if raw.is_empty() { b"{}" } else { raw };
    let Ok(m) = serde_json::from_slice::<Mounts>(raw) else {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "volumeMounts: a list of {\"name\", \"path\"}",
        ));
    };
    let Some(mounts) = m.volume_mounts.filter(|m| !m.is_empty()) else {
        return Ok(());
    };
    let all = control(e2b)?.volumes().list(who).await?;
    for m in mounts {
        let name = e2b_name(&m.name)?;
        if !all.iter().any(|v| v.name == name) {
            return Err(E2bError::new(
                StatusCode::NOT_FOUND,
                format!("volume {name} does not exist (Volume.create(\"{name}\") makes it)"),
            ));
        }
        let path = MountPath::try_from(m.path)
            .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, format!("volumeMounts: {e}")))?;
        spec.volumes.push(VolumeMount {
            name,
            path,
            read_only: false,
        });
    }
    Ok(())
}

/// `volumeMounts` of a sandbox's info.
pub(crate) fn mounts_of(info: &SandboxInfo) -> Value {
    info.spec
        .volumes
        .iter()
        .map(|m| json!({"name": m.name, "path": m.path}))
        .collect()
}

// ------------------------------------------------------------ content API

/// A content-API refusal: `{code, message}` with the status as a string
/// code (the content API's own error shape).
#[derive(Debug)]
struct ContentError {
    status: StatusCode,
    message: String,
}

impl ContentError {
    fn new(status: StatusCode, message: impl Into<String>) -> ContentError {
        ContentError {
            status,
            message: message.into(),
        }
    }
}

impl From<ApiError> for ContentError {
    fn from(e: ApiError) -> Self {
        let status =
            StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ContentError::new(status, e.message)
    }
}

impl From<E2bError> for ContentError {
    fn from(e: E2bError) -> Self {
        let (status, message) = e.parts();
        ContentError::new(status, message)
    }
}

impl IntoResponse for ContentError {
    fn into_response(self) -> Response {
        let code = json!(self.status.as_u16().to_string());
        crate::reply::error_response(self.status, code, self.message)
    }
}

type ContentResult<T> = Result<T, ContentError>;

fn bad(message: impl Into<String>) -> ContentError {
    ContentError::new(StatusCode::BAD_REQUEST, message)
}

/// The volume a content request may use: its bearer token must be that
/// volume's (401 without one, 403 with another, or for a volume that does
/// not exist: a token says nothing about other volumes).
async fn open(e2b: &E2b, headers: &HeaderMap, id: &str) -> ContentResult<VolumeFiles> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ContentError::new(
                StatusCode::UNAUTHORIZED,
                "missing volume token: send Authorization: Bearer <the token Volume.create or Volume.connect gave>",
            )
        })?;
    let refused = || {
        ContentError::new(
            StatusCode::FORBIDDEN,
            format!("this token is not volume {id:?}'s (or no such volume exists)"),
        )
    };
    let name = VolumeName::try_from(id.to_string()).map_err(|_| refused())?;
    let files = control(e2b)?
        .volumes()
        .files(&name)
        .await
        .map_err(|e| match e.code {
            ErrorCode::NotFound => refused(),
            _ => e.into(),
        })?;
    if !e2b.volume_token_ok(&files.info, token) {
        return Err(refused());
    }
    Ok(files)
}

/// A content path as E2B's server takes it: relative ones are from the
/// volume's root, `//` and `.` collapse, a trailing `/` goes; `..` is
/// refused (a path never leaves the volume, and the node resolves every
/// one inside it besides).
fn volume_path(path: Option<&str>) -> ContentResult<String> {
    let path = path.unwrap_or_default();
    if path.is_empty() {
        return Err(bad("path is required (?path=/FILE)"));
    }
    if path.contains('\0') {
        return Err(bad("path contains a NUL byte"));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(bad(format!(
                    "path {path:?}: `..` is not taken; give the path from the volume's root"
                )))
            }
            p => parts.push(p),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string())
}

/// E2B's `VolumeEntryStat`; `mode` is the permission bits only.
fn entry_stat(e: &PathEntry) -> Value {
    let name = match e.path.rsplit('/').next() {
        Some("") | None => "/",
        Some(n) => n,
    };
    let kind = match e.kind {
        PathKind::File => "file",
        PathKind::Dir => "directory",
        PathKind::Symlink => "symlink",
        PathKind::Other => "unknown",
    };
    let mut v = json!({
        "name": name,
        "type": kind,
        "path": e.path,
        "size": e.size,
        "mode": e.mode & 0o7777,
        "uid": e.uid,
        "gid": e.gid,
        "atime": rfc3339(e.accessed_ms.unwrap_or(e.modified_ms)),
        "mtime": rfc3339(e.modified_ms),
        "ctime": rfc3339(e.changed_ms.unwrap_or(e.modified_ms)),
    });
    if let Some(t) = &e.symlink_target {
        v["target"] = json!(t);
    }
    v
}

#[derive(Deserialize, Default)]
struct ContentQuery {
    path: Option<String>,
    depth: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: Option<bool>,
}

/// What every content call starts from: its query, the volume its token
/// opens (checked before anything else is looked at), and the path in it.
struct Content {
    files: VolumeFiles,
    /// Rooted in the volume (see [`volume_path`]).
    path: String,
    q: ContentQuery,
}

impl FromRequestParts<Arc<E2b>> for Content {
    type Rejection = ContentError;

    async fn from_request_parts(parts: &mut Parts, e2b: &Arc<E2b>) -> ContentResult<Content> {
        let Query(q) = Query::<ContentQuery>::from_request_parts(parts, e2b)
            .await
            .map_err(|e| bad(format!("query: {e}")))?;
        let Path(id) = Path::<String>::from_request_parts(parts, e2b)
            .await
            .map_err(|e| bad(format!("volume id: {e}")))?;
        let files = open(e2b, &parts.headers, &id).await?;
        let path = volume_path(q.path.as_deref())?;
        Ok(Content { files, path, q })
    }
}

/// The owner a made file or directory gets (root unless the query says).
fn owner(q: &ContentQuery) -> ContentResult<Owner> {
    Ok(Owner {
        uid: id_of("uid", q.uid)?.unwrap_or(0),
        gid: id_of("gid", q.gid)?.unwrap_or(0),
    })
}

fn id_of(what: &str, id: Option<u32>) -> ContentResult<Option<u32>> {
    match id {
        Some(id) if id > MAX_ID => Err(bad(format!(
            "{what} {id}: 0 to {MAX_ID} (the ids a sandbox has)"
        ))),
        id => Ok(id),
    }
}

fn mode_of(mode: Option<u32>) -> ContentResult<Option<u32>> {
    match mode {
        Some(m) if m > 0o7777 => Err(bad(format!(
            "mode {m} ({m:o} in octal): permission bits only, at most 0o7777"
        ))),
        m => Ok(m),
    }
}

/// The one entry an operation answers.
fn first(entries: Vec<PathEntry>, path: &str) -> ContentResult<PathEntry> {
    entries.into_iter().next().ok_or_else(|| {
        ContentError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{path}: the node answered no entry"),
        )
    })
}

/// A read's or a listing's refusal: what is not there, or not of the kind
/// asked (a directory's path is already checked), is 404.
fn not_there(e: ApiError) -> ContentError {
    match e.code {
        ErrorCode::BadRequest | ErrorCode::NotFound => {
            ContentError::new(StatusCode::NOT_FOUND, e.message)
        }
        _ => e.into(),
    }
}

async fn stat(Content { files, path, .. }: Content) -> ContentResult<Json<Value>> {
    let got = files
        .path_op(PathOp::Stat { path: path.clone() })
        .await
        .map_err(not_there)?;
    Ok(Json(entry_stat(&first(got, &path)?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
    #[serde(default)]
    mode: Option<u32>,
}

/// `update_metadata`: the owner, group and/or mode given.
async fn set_attrs(Content { files, path, .. }: Content, raw: Bytes) -> ContentResult<Json<Value>> {
    let raw: &[u8] = if raw.is_empty() { b"{}" } else { &raw };
    let m: Metadata = serde_json::from_slice(raw).map_err(|e| {
        bad(format!(
            "Invalid metadata provided: {e} (send {{\"uid\", \"gid\", \"mode\"}})"
        ))
    })?;
    let op = PathOp::SetAttrs {
        path: path.clone(),
        uid: id_of("uid", m.uid)?,
        gid: id_of("gid", m.gid)?,
        mode: mode_of(m.mode)?,
    };
    let got = files.path_op(op).await?;
    Ok(Json(entry_stat(&first(got, &path)?)))
}

/// Removes a file, a link, or a directory with all it holds.
async fn remove(Content { files, path, .. }: Content) -> ContentResult<StatusCode> {
    if path == "/" {
        return Err(bad(
            "/ is the volume's root: remove what is in it, or the volume (Volume.destroy)",
        ));
    }
    files.path_op(PathOp::Remove { path }).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A directory's entries (`depth` levels; 1: its own), the directory
/// itself left out.
async fn list_dir(Content { files, path, q }: Content) -> ContentResult<Json<Value>> {
    let op = PathOp::List {
        path,
        depth: q.depth.unwrap_or(1).max(1),
    };
    let entries = files.path_op(op).await.map_err(not_there)?;
    Ok(Json(entries.iter().map(entry_stat).collect()))
}

/// `make_dir`: with `force`, its parents too and an existing directory
/// answered as it is.
async fn make_dir(Content { files, path, q }: Content) -> ContentResult<Response> {
    let force = q.force.unwrap_or(false);
    let op = PathOp::MakeDirAs {
        path: path.clone(),
        owner: owner(&q)?,
        mode: mode_of(q.mode)?.unwrap_or(0o755),
        parents: force,
        exist_ok: force,
    };
    let got = files.path_op(op).await?;
    Ok((StatusCode::CREATED, Json(entry_stat(&first(got, &path)?))).into_response())
}

/// A file's bytes (404 for a directory or anything but a file).
async fn read_file(Content { files, path, .. }: Content) -> ContentResult<Response> {
    let read = files.read(&path).await.map_err(not_there)?;
    let FileKind::File { size } = read.kind else {
        return Err(ContentError::new(
            StatusCode::NOT_FOUND,
            format!("{path}: is a directory, not a file (list it with vol.list)"),
        ));
    };
    let mut resp = Body::from_stream(read.body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(resp)
}

/// Writes a file from the body, all or nothing: 409 when something is
/// there (without `force`) or a directory is, 404 when its directory is
/// not (parents are not made).
async fn write_file(Content { files, path, q }: Content, upload: Body) -> ContentResult<Response> {
    if path == "/" {
        return Err(bad("path names the volume's root; give a file's path"));
    }
    let req = VolumeWrite {
        file: WriteFile {
            path: path.clone(),
            mode: mode_of(q.mode)?.unwrap_or(0o644),
            tar: false,
            xattrs: Default::default(),
        },
        owner: owner(&q)?,
        replace: q.force.unwrap_or(false),
    };
    let written = files.write(req, warren_control::upload(upload)).await?;
    Ok((StatusCode::CREATED, Json(entry_stat(&written))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_paths_are_rooted_in_the_volume() {
        let p = |s: &str| volume_path(Some(s)).map_err(|e| e.message);
        assert_eq!(p("hello.txt").unwrap(), "/hello.txt");
        assert_eq!(p("//a//b/./c/").unwrap(), "/a/b/c");
        assert_eq!(p("/").unwrap(), "/");
        assert_eq!(p("./").unwrap(), "/");
        for bad in ["", "/a/../../etc", "..", "a\0b"] {
            assert!(volume_path(Some(bad)).is_err(), "{bad:?}");
        }
        assert!(volume_path(None).is_err());
    }

    #[test]
    fn names_are_e2bs_and_warrens() {
        assert_eq!(e2b_name("test-volume").unwrap().as_str(), "test-volume");
        assert_eq!(e2b_name("a_1").unwrap().as_str(), "a_1");
        for bad in ["", "My-Vol", "a.b", "a b", "-a", "_a", &"x".repeat(64)] {
            assert!(e2b_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn stats_are_e2bs() {
        let e = PathEntry {
            path: "/d/link".into(),
            kind: PathKind::Symlink,
            size: 4,
            mode: 0o4755,
            uid: 1000,
            gid: 1000,
            modified_ms: 1_735_689_600_500,
            accessed_ms: None,
            changed_ms: Some(1_735_689_601_000),
            symlink_target: Some("/x".into()),
            xattrs: Default::default(),
        };
        let v = entry_stat(&e);
        assert_eq!(v["name"], "link");
        assert_eq!(v["type"], "symlink");
        assert_eq!(v["mode"], 0o4755);
        assert_eq!(v["target"], "/x");
        assert_eq!(v["mtime"], "2025-01-01T00:00:00.5Z");
        assert_eq!(v["atime"], v["mtime"]);
        assert_eq!(v["ctime"], "2025-01-01T00:00:01Z");
        let root = PathEntry {
            path: "/".into(),
            kind: PathKind::Dir,
            symlink_target: None,
            ..e
        };
        let v = entry_stat(&root);
        assert_eq!(
            (v["name"].as_str(), v["type"].as_str()),
            (Some("/"), Some("directory"))
        );
        assert!(v.get("target").is_none());
    }

    #[test]
    fn tokens_are_bound_to_a_volume_and_its_creation() {
        let home = tempfile::tempdir().expect("home");
        let e2b = E2b::new(
            warren_control::ControlCell::default(),
            "api-token".into(),
            home.path(),
            Default::default(),
        )
        .expect("e2b");
        let v = |name: &str, at: &str| VolumeInfo {
            name: VolumeName::try_from(name.to_string()).expect("name"),
            size: DEFAULT_SIZE,
            used: 0,
            node: "n".into(),
            created_at: at.into(),
            mounted_by: Vec::new(),
        };
        let a = v("data", "2026-01-01T00:00:00Z");
        let token = e2b.volume_token(&a);
        assert!(e2b.volume_token_ok(&a, &token));
        assert!(!e2b.volume_token_ok(&v("datb", "2026-01-01T00:00:00Z"), &token));
        // The same name made again is another volume.
        assert!(!e2b.volume_token_ok(&v("data", "2026-01-02T00:00:00Z"), &token));
        assert!(!e2b.volume_token_ok(&a, ""));
        assert_ne!(token, e2b.access_token("data"));
    }
}

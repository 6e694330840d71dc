//! envd's `/files`: `GET` downloads a file, `POST` uploads one or more
//! (multipart, one part per file named by its destination path, or a raw
//! octet-stream body, gzip allowed). Bodies stream through; nothing is held
//! whole. A request carries the sandbox's access token or a URL signed
//! with it (the SDK's `download_url`/`upload_url`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Digest;
use warren_control::ByteStream;
use warren_core::files::{FileKind, WriteFile};
use warren_core::{ApiError, ErrorCode};

use super::{paths, plain_error, Target};
use crate::E2b;

#[derive(Deserialize, Default)]
pub struct FileQuery {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    pub(crate) signature: Option<String>,
    #[serde(default)]
    signature_expiration: Option<i64>,
}

/// envd's `/files` errors: `{message, code}`.
fn error(e: ApiError) -> Response {
    let status = match e.code {
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::BadRequest | ErrorCode::Conflict => StatusCode::BAD_REQUEST,
        ErrorCode::Unavailable => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    plain_error(status, e.message)
}

/// The user a call acts as, once it proved it may: with the token, the one
/// it names (`username=` or `Authorization: Basic`); with a signed URL, the
/// one signed (None: the default user), whatever headers say.
type Authorized = Option<String>;

/// The token, or a signature made with it for this path, operation and
/// user (`v1_` + unpadded base64 of SHA-256 over
/// `path:operation:user:token[:expiration]`).
fn authorized(
    e2b: &E2b,
    target: &Target,
    headers: &HeaderMap,
    q: &FileQuery,
    operation: &str,
) -> Option<Authorized> {
    let id = &target.id;
    let given = headers
        .get("x-access-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if e2b.token_ok(id, given) {
        return Some(q.username.clone().or_else(|| target.user(headers)));
    }
    if !signed_for(e2b, id, q, operation) {
        return None;
    }
    Some(
        q.username
            .clone()
            .filter(|u| !u.is_empty())
            .or_else(|| target.accounts.default_user.clone()),
    )
}

/// Whether `q` carries an unexpired signature made with sandbox `id`'s
/// access token for its path, `operation` and user.
pub(crate) fn signed_for(e2b: &E2b, id: &str, q: &FileQuery, operation: &str) -> bool {
    let Some(signature) = &q.signature else {
        return false;
    };
    if let Some(exp) = q.signature_expiration {
        if exp < time::OffsetDateTime::now_utc().unix_timestamp() {
            return false;
        }
    }
    let mut text = format!(
        "{}:{operation}:{}:{}",
        q.path.as_deref().unwrap_or(""),
        q.username.as_deref().unwrap_or(""),
        e2b.access_token(id)
    );
    if let Some(exp) = q.signature_expiration {
        text.push_str(&format!(":{exp}"));
    }
    let want = format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD
            .encode(sha2::Sha256::digest(text.as_bytes()))
    );
    use subtle::ConstantTimeEq;
    want.as_bytes().ct_eq(signature.as_bytes()).into()
}

/// Whether the request's signature has run out (envd answers that in
/// its own words, which its SDK tests look for).
pub(crate) fn expired(q: &FileQuery) -> bool {
    q.signature.is_some()
        && q.signature_expiration
            .is_some_and(|exp| exp < time::OffsetDateTime::now_utc().unix_timestamp())
}

/// envd's answer to an expired signature.
pub(crate) fn expired_answer() -> Response {
    plain_error(StatusCode::UNAUTHORIZED, "signature is already expired")
}

/// The operation a `/files` request signs: a read for GET, a write else.
pub(crate) fn operation_of(method: &axum::http::Method) -> &'static str {
    if method == axum::http::Method::GET {
        "read"
    } else {
        "write"
    }
}

fn unauthorized() -> Response {
    plain_error(
        StatusCode::UNAUTHORIZED,
        "missing or wrong X-Access-Token (or URL signature) for /files",
    )
}

pub async fn read(
    State(e2b): State<Arc<E2b>>,
    Extension(target): Extension<Target>,
    Query(q): Query<FileQuery>,
    headers: HeaderMap,
) -> Response {
    if expired(&q) {
        return expired_answer();
    }
    let Some(user) = authorized(&e2b, &target, &headers, &q, "read") else {
        return unauthorized();
    };
    let Some(path) = q.path.as_deref().filter(|p| !p.is_empty()) else {
        return plain_error(
            StatusCode::BAD_REQUEST,
            "path is required: /files?path=FILE",
        );
    };
    let path = paths::resolve(path, user.as_deref());
    match target.control.io().read_file(&target.id, &path).await {
        Err(e) => error(e),
        Ok(r) => match r.kind {
            FileKind::Dir => plain_error(
                StatusCode::BAD_REQUEST,
                format!("{path} is a directory; read files one by one (list it first)"),
            ),
            FileKind::File { size } => {
                let body = Body::from_stream(r.body.map_err(|e| std::io::Error::other(e.message)));
                (
                    [
                        (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                        (header::CONTENT_LENGTH, size.to_string()),
                    ],
                    body,
                )
                    .into_response()
            }
        },
    }
}

pub async fn write(
    State(e2b): State<Arc<E2b>>,
    Extension(target): Extension<Target>,
    Query(q): Query<FileQuery>,
    req: Request,
) -> Response {
    if expired(&q) {
        return expired_answer();
    }
    let Some(user) = authorized(&e2b, &target, req.headers(), &q, "write") else {
        return unauthorized();
    };
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let meta = match metadata(req.headers()) {
        Ok(meta) => meta,
        Err(e) => return error(e),
    };
    let result = if content_type.starts_with("multipart/form-data") {
        write_multipart(&target, &q, user.as_deref(), &meta, req).await
    } else {
        write_raw(&target, &q, user.as_deref(), &meta, req).await
    };
    match result {
        Ok(written) => Json(written).into_response(),
        Err(e) => error(e),
    }
}

/// The namespace envd keeps file metadata in: metadata `k` is the extended
/// attribute `user.e2b.k`.
pub(crate) const METADATA_XATTR: &str = "user.e2b.";
/// The upload headers metadata arrives in (`X-Metadata-K: V`).
const METADATA_HEADER: &str = "x-metadata-";

/// File metadata from an upload's `X-Metadata-*` headers (keys lowercased,
/// as envd keeps them): HTTP tokens for keys, printable ASCII for values.
fn metadata(headers: &HeaderMap) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER) else {
            continue;
        };
        let value = value
            .to_str()
            .ok()
            .filter(|v| v.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "metadata {key:?}: the value must be printable ASCII"
                ))
            })?;
        if key.is_empty() {
            return Err(ApiError::bad_request("metadata keys must not be empty"));
        }
        out.insert(format!("{METADATA_XATTR}{key}"), value.to_string());
    }
    Ok(out)
}

/// A file's metadata, from its `user.e2b.*` extended attributes.
pub(crate) fn metadata_of(xattrs: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    xattrs
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(METADATA_XATTR)?.to_string(), v.clone())))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

fn written(path: &str, xattrs: &BTreeMap<String, String>) -> Value {
    let mut v =
        json!({"name": path.rsplit('/').next().unwrap_or_default(), "type": "file", "path": path});
    let meta = metadata_of(xattrs);
    if !meta.is_empty() {
        v["metadata"] = json!(meta);
    }
    v
}

async fn write_one(
    target: &Target,
    path: &str,
    xattrs: &BTreeMap<String, String>,
    body: ByteStream,
) -> Result<Value, ApiError> {
    let req = WriteFile {
        path: path.to_string(),
        mode: 0o644,
        tar: false,
        xattrs: xattrs.clone(),
    };
    target
        .control
        .io()
        .write_file(&target.id, req, body)
        .await?;
    Ok(written(path, xattrs))
}

async fn write_raw(
    target: &Target,
    q: &FileQuery,
    user: Option<&str>,
    meta: &BTreeMap<String, String>,
    req: Request,
) -> Result<Vec<Value>, ApiError> {
    let Some(path) = q.path.as_deref().filter(|p| !p.is_empty()) else {
        return Err(ApiError::bad_request(
            "path is required for a raw upload: /files?path=FILE",
        ));
    };
    let path = paths::resolve(path, user);
    let gzip = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let body = warren_control::upload(req.into_body());
    let body = if gzip { gunzip(body) } else { body };
    Ok(vec![write_one(target, &path, meta, body).await?])
}

async fn write_multipart(
    target: &Target,
    q: &FileQuery,
    user: Option<&str>,
    meta: &BTreeMap<String, String>,
    req: Request,
) -> Result<Vec<Value>, ApiError> {
    let mut multipart = Multipart::from_request(req, &())
        .await
        .map_err(|e| ApiError::bad_request(format!("malformed multipart upload: {e}")))?;
    let mut out = Vec::new();
    while let Some(mut field) = multipart
        .next_field()
        .await
        .map_err(|e| ApiError::bad_request(format!("malformed multipart upload: {e}")))?
    {
        // With one file the query names it; with several, each part's
        // file name is its destination.
        let dest = match (q.path.as_deref().filter(|p| !p.is_empty()), field.file_name()) {
            (Some(p), _) if out.is_empty() => p.to_string(),
            (_, Some(name)) if !name.is_empty() => name.to_string(),
            _ => {
                return Err(ApiError::bad_request(
                    "each multipart part needs a file name (its destination path), or give ?path= for a single file",
                ))
            }
        };
        let path = paths::resolve(&dest, user);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, ApiError>>(8);
        let body = received(rx);
        let pump = async move {
            loop {
                match field.chunk().await {
                    Ok(Some(chunk)) => {
                        if tx.send(Ok(chunk)).await.is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx
                            .send(Err(ApiError::bad_request(format!(
                                "reading the upload: {e}"
                            ))))
                            .await;
                        break;
                    }
                }
            }
        };
        let (_, written) = tokio::join!(pump, write_one(target, &path, meta, body));
        out.push(written?);
    }
    if out.is_empty() {
        return Err(ApiError::bad_request(
            "the multipart upload holds no file part",
        ));
    }
    Ok(out)
}

/// Decompresses a gzip body as it streams (on a blocking thread: flate2
/// reads synchronously).
fn gunzip(body: ByteStream) -> ByteStream {
    let reader =
        tokio_util::io::StreamReader::new(body.map_err(|e| std::io::Error::other(e.message)));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, ApiError>>(8);
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let bridge = tokio_util::io::SyncIoBridge::new(reader);
        let mut gz = flate2::read::GzDecoder::new(bridge);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match gz.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(ApiError::bad_request(format!(
                        "the upload is not valid gzip: {e}"
                    ))));
                    break;
                }
            }
        }
    });
    received(rx)
}

/// What arrives on `rx`, as an upload body.
fn received(rx: tokio::sync::mpsc::Receiver<Result<Bytes, ApiError>>) -> ByteStream {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
        .boxed()
}

//! envd's `filesystem.Filesystem` service on Warren's path operations
//! (stat, list, make a directory, rename, remove), which the node runs
//! confined to the sandbox's root.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};
use warren_core::ErrorCode;
use warren_node_api::{PathEntry, PathKind, PathOp};

use super::{paths, Target};
use crate::connect::{self, Code, RpcError};
use crate::E2b;

#[derive(Deserialize)]
struct PathRequest {
    path: String,
    #[serde(default)]
    depth: u32,
}

#[derive(Deserialize)]
struct MoveRequest {
    source: String,
    destination: String,
}

pub async fn rpc(
    State(_e2b): State<Arc<E2b>>,
    Extension(target): Extension<Target>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = match method.as_str() {
        "Stat" | "ListDir" | "MakeDir" | "Remove" => {
            path_call(&target, &method, &headers, &body).await
        }
        "Move" => move_call(&target, &headers, &body).await,
        "WatchDir" => {
            return connect::stream_error(RpcError::new(
                Code::Unimplemented,
                "watching directories is not supported by Warren; poll with list instead",
            ))
        }
        "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => Err(RpcError::new(
            Code::Unimplemented,
            "watching directories is not supported by Warren; poll with list instead",
        )),
        other => Err(RpcError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem has no method {other:?}"),
        )),
    };
    connect::unary(result)
}

async fn path_call(
    target: &Target,
    method: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, RpcError> {
    let req: PathRequest = connect::decode(headers, body)?;
    let user = paths::user(headers);
    let path = paths::resolve(&req.path, user.as_deref());
    let op = match method {
        "Stat" => PathOp::Stat { path },
        "ListDir" => PathOp::List {
            path,
            depth: req.depth.max(1),
        },
        "MakeDir" => PathOp::MakeDir { path },
        _ => PathOp::Remove { path },
    };
    let entries =
        target
            .control
            .path_op(&target.id, op)
            .await
            .map_err(|e| match (method, e.code) {
                ("MakeDir", ErrorCode::Conflict) => RpcError::new(Code::AlreadyExists, e.message),
                _ => e.into(),
            })?;
    Ok(match method {
        "ListDir" => json!({"entries": entries.iter().map(entry).collect::<Vec<_>>()}),
        "Remove" => json!({}),
        _ => json!({"entry": entries.first().map(entry)}),
    })
}

async fn move_call(target: &Target, headers: &HeaderMap, body: &[u8]) -> Result<Value, RpcError> {
    let req: MoveRequest = connect::decode(headers, body)?;
    let user = paths::user(headers);
    let op = PathOp::Rename {
        from: paths::resolve(&req.source, user.as_deref()),
        to: paths::resolve(&req.destination, user.as_deref()),
    };
    let entries = target.control.path_op(&target.id, op).await?;
    Ok(json!({"entry": entries.first().map(entry)}))
}

/// envd's `EntryInfo` in proto3 JSON (int64 as a string, enums by name).
fn entry(e: &PathEntry) -> Value {
    let name = e.path.rsplit('/').next().unwrap_or_default();
    let kind = match e.kind {
        PathKind::Dir => "FILE_TYPE_DIRECTORY",
        PathKind::Symlink => "FILE_TYPE_SYMLINK",
        PathKind::File | PathKind::Other => "FILE_TYPE_FILE",
    };
    let modified =
        time::OffsetDateTime::from_unix_timestamp_nanos(e.modified_ms as i128 * 1_000_000)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            });
    let mut v = json!({
        "name": if name.is_empty() { "/" } else { name },
        "type": kind,
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode,
        "permissions": permissions(e.kind, e.mode),
        "owner": owner(e.uid),
        "group": owner(e.gid),
    });
    if let Some(m) = modified {
        v["modifiedTime"] = json!(m);
    }
    if let Some(t) = &e.symlink_target {
        v["symlinkTarget"] = json!(t);
        v["isSymlink"] = json!(true);
    }
    v
}

fn owner(id: u32) -> String {
    if id == 0 {
        "root".into()
    } else {
        id.to_string()
    }
}

/// Go's `FileMode.String()`, which envd reports.
fn permissions(kind: PathKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        PathKind::Dir => 'd',
        PathKind::Symlink => 'L',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_envd_entry_infos() {
        let e = PathEntry {
            path: "/tmp/a.txt".into(),
            kind: PathKind::File,
            size: 3,
            mode: 0o644,
            uid: 0,
            gid: 0,
            modified_ms: 1_735_689_600_000,
            symlink_target: None,
        };
        let v = entry(&e);
        assert_eq!(v["name"], "a.txt");
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "3");
        assert_eq!(v["permissions"], "-rw-r--r--");
        assert_eq!(v["owner"], "root");
        assert_eq!(v["modifiedTime"], "2025-01-01T00:00:00Z");
        assert_eq!(permissions(PathKind::Dir, 0o755), "drwxr-xr-x");
    }
}

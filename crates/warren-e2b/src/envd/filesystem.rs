//! envd's `filesystem.Filesystem` service on Warren's path operations
//! (stat, list, make a directory, rename, remove), which the node runs
//! confined to the sandbox's root.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use warren_control::WatchEvent;
use warren_core::files::{PathEntry, PathKind, PathOp, WatchKind};
use warren_core::sync::lock;
use warren_core::ErrorCode;

use super::users::Accounts;
use super::{paths, Target};
use crate::connect::{self, Code, Item, RpcError};
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

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    #[serde(default, alias = "recursive")]
    recursive: bool,
    /// Each event carries the entry it is about (when it still exists).
    #[serde(default, alias = "include_entry")]
    include_entry: bool,
    // `allowNetworkMounts` lifts envd's refusal to watch network mounts;
    // a sandbox's directories are all local, so it is not read here.
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherRequest {
    #[serde(alias = "watcher_id")]
    watcher_id: String,
}

/// The most events a polled watcher holds between two `GetWatcherEvents`;
/// older ones are dropped beyond it.
const MAX_BUFFERED: usize = 10_000;
/// The most polled watchers open at once (over all sandboxes).
const MAX_WATCHERS: usize = 1024;

/// The polled watchers (`CreateWatcher`): each buffers its events until
/// `GetWatcherEvents` drains them, and goes with `RemoveWatcher`.
#[derive(Default)]
pub struct Watchers {
    by_id: Mutex<HashMap<String, Arc<Watcher>>>,
    next: AtomicU64,
}

struct Watcher {
    sandbox: String,
    state: Arc<Mutex<Buffered>>,
    /// Woken by each event the watch buffers.
    arrived: Arc<tokio::sync::Notify>,
    task: tokio::task::AbortHandle,
}

/// How long a poll that finds no event waits for one: a change made just
/// before the poll is then in its answer (envd reads inotify in-process;
/// here the event crosses the node contract first).
const POLL_WAIT: std::time::Duration = std::time::Duration::from_millis(300);

/// How long a poll that has events waits for the next one: a change's
/// events (a directory made, then a file written in it) cross the node
/// contract one by one, and on a busy host 30 ms split them over two polls
/// (seen in E2B's recursive-watch test while another suite ran).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

#[derive(Default)]
struct Buffered {
    events: VecDeque<Value>,
    /// Why the watch ended early, reported once the events are drained.
    error: Option<RpcError>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn rpc(
    State(e2b): State<Arc<E2b>>,
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
        "WatchDir" => return watch_dir(&target, &headers, &body).await,
        "CreateWatcher" => create_watcher(&e2b.watchers, &target, &headers, &body).await,
        "GetWatcherEvents" => watcher_events(&e2b.watchers, &target, &headers, &body).await,
        "RemoveWatcher" => remove_watcher(&e2b.watchers, &target, &headers, &body),
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
    let user = target.user(headers);
    let path = paths::resolve(&req.path, user.as_deref());
    if method == "Stat" {
        let found = stat_following(target, &path).await?;
        return Ok(json!({"entry": entry(&found, &target.accounts)}));
    }
    let op = match method {
        "ListDir" => PathOp::List {
            path,
            depth: req.depth.max(1),
        },
        "MakeDir" => PathOp::MakeDir { path },
        _ => PathOp::Remove { path },
    };
    let entries = match target.control.io().path_op(&target.id, op).await {
        Ok(entries) => entries,
        // envd removes with RemoveAll: nothing there is nothing to do.
        Err(e) if method == "Remove" && e.code == ErrorCode::NotFound => Vec::new(),
        Err(e) if method == "MakeDir" && e.code == ErrorCode::Conflict => {
            return Err(RpcError::new(Code::AlreadyExists, e.message))
        }
        Err(e) => return Err(e.into()),
    };
    Ok(match method {
        "ListDir" => json!({"entries": entries
            .iter()
            .map(|e| entry(e, &target.accounts))
            .collect::<Vec<_>>()}),
        "Remove" => json!({}),
        _ => json!({"entry": entries.first().map(|e| entry(e, &target.accounts))}),
    })
}

/// Links followed before a Stat gives up (as the kernel's ELOOP).
const MAX_LINKS: usize = 40;

/// envd's Stat follows symlinks (Go's os.Stat): the entry of `path` with
/// the type, size and mode of what it finally points at, and that target's
/// absolute path; a dangling link is not found. Each hop is a Stat inside
/// the sandbox's root, so a link cannot lead out of it.
async fn stat_following(target: &Target, path: &str) -> Result<PathEntry, RpcError> {
    let stat = |p: String| async move {
        let mut found = target
            .control
            .io()
            .path_op(&target.id, PathOp::Stat { path: p })
            .await?;
        found
            .pop()
            .ok_or_else(|| warren_core::ApiError::not_found(format!("{path}: not found")))
    };
    let first = stat(path.to_string()).await?;
    let Some(link) = first.symlink_target.clone() else {
        return Ok(first);
    };
    let mut at = first.path.clone();
    let mut next = link;
    for _ in 0..MAX_LINKS {
        let resolved = if next.starts_with('/') {
            next.clone()
        } else {
            let dir = at.rsplit_once('/').map_or("", |(d, _)| d);
            format!("{dir}/{next}")
        };
        let found = stat(resolved).await?;
        match found.symlink_target.clone() {
            Some(t) => {
                at = found.path;
                next = t;
            }
            // envd gives the link's target as the absolute path it
            // resolves to (as filepath.EvalSymlinks).
            None => {
                return Ok(PathEntry {
                    path: first.path,
                    symlink_target: Some(found.path.clone()),
                    ..found
                })
            }
        }
    }
    Err(RpcError::new(
        Code::InvalidArgument,
        format!("{path}: more than {MAX_LINKS} symbolic links in a row"),
    ))
}

async fn move_call(target: &Target, headers: &HeaderMap, body: &[u8]) -> Result<Value, RpcError> {
    let req: MoveRequest = connect::decode(headers, body)?;
    let user = target.user(headers);
    let op = PathOp::Rename {
        from: paths::resolve(&req.source, user.as_deref()),
        to: paths::resolve(&req.destination, user.as_deref()),
    };
    let entries = target.control.io().path_op(&target.id, op).await?;
    Ok(json!({"entry": entries.first().map(|e| entry(e, &target.accounts))}))
}

/// The node's watch of the request's directory, and how its events are
/// told.
async fn start_watch(
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(BoxStream<'static, WatchEvent>, Telling), RpcError> {
    let req: WatchRequest = connect::decode(headers, body)?;
    let user = target.user(headers);
    let path = paths::resolve(&req.path, user.as_deref());
    let events = target
        .control
        .io()
        .watch(&target.id, &path, req.recursive)
        .await?;
    let telling = Telling {
        entries: req.include_entry.then(|| (target.clone(), path)),
    };
    Ok((events, telling))
}

/// How a watch's events are told: with the entry each is about, when the
/// request asked (the sandbox and the watched directory).
#[derive(Clone)]
struct Telling {
    entries: Option<(Target, String)>,
}

impl Telling {
    /// envd's `FilesystemEvent` in proto3 JSON; the error for an ending
    /// one. The entry is looked up as the event is told, so it is left out
    /// when the path is gone by then (as envd does, best effort).
    async fn event(&self, ev: WatchEvent) -> Result<Value, RpcError> {
        match ev {
            WatchEvent::Event { name, kind } => {
                let kind_name = match kind {
                    WatchKind::Create => "EVENT_TYPE_CREATE",
                    WatchKind::Write => "EVENT_TYPE_WRITE",
                    WatchKind::Remove => "EVENT_TYPE_REMOVE",
                    WatchKind::Rename => "EVENT_TYPE_RENAME",
                    WatchKind::Chmod => "EVENT_TYPE_CHMOD",
                };
                let mut v = json!({"name": name, "type": kind_name});
                if let (Some((target, dir)), false) = (&self.entries, kind == WatchKind::Remove) {
                    let path = format!("{}/{name}", dir.trim_end_matches('/'));
                    let found = target
                        .control
                        .io()
                        .path_op(&target.id, PathOp::Stat { path })
                        .await;
                    if let Some(e) = found.ok().and_then(|mut f| f.pop()) {
                        v["entry"] = entry(&e, &target.accounts);
                    }
                }
                Ok(v)
            }
            WatchEvent::Error { error } => Err(error.into()),
        }
    }
}

/// `WatchDir`: a start event, then the directory's events (keepalives
/// while quiet) until the client hangs up or the directory goes.
async fn watch_dir(target: &Target, headers: &HeaderMap, body: &[u8]) -> Response {
    let (events, telling) = match start_watch(target, headers, body).await {
        Ok(started) => started,
        Err(e) => return connect::stream_error(e),
    };
    let keepalive = connect::keepalive(headers);
    let start = futures_util::stream::iter([Item::Message(json!({"start": {}}))]);
    let rest = futures_util::stream::unfold(Some(events), move |events| {
        let telling = telling.clone();
        async move {
            let mut events = events?;
            match tokio::time::timeout(keepalive, events.next()).await {
                Err(_) => Some((Item::Message(json!({"keepalive": {}})), Some(events))),
                Ok(None) => Some((Item::End(Ok(())), None)),
                Ok(Some(ev)) => match telling.event(ev).await {
                    Ok(v) => Some((Item::Message(json!({"filesystem": v})), Some(events))),
                    Err(e) => Some((Item::End(Err(e)), None)),
                },
            }
        }
    });
    connect::server_stream(start.chain(rest))
}

async fn create_watcher(
    watchers: &Watchers,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, RpcError> {
    {
        // At the bound, watchers whose watch is over (their sandbox or
        // directory went) and that were never removed make room.
        let mut table = lock(&watchers.by_id);
        if table.len() >= MAX_WATCHERS {
            table.retain(|_, w| !w.task.is_finished());
        }
    }
    if lock(&watchers.by_id).len() >= MAX_WATCHERS {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("{MAX_WATCHERS} watchers are open; remove some with RemoveWatcher"),
        ));
    }
    let (mut events, telling) = start_watch(target, headers, body).await?;
    let state = Arc::new(Mutex::new(Buffered::default()));
    let arrived = Arc::new(tokio::sync::Notify::new());
    let task = {
        let (state, arrived) = (state.clone(), arrived.clone());
        tokio::spawn(async move {
            while let Some(ev) = events.next().await {
                let told = telling.event(ev).await;
                {
                    let mut st = lock(&state);
                    match told {
                        Ok(v) => {
                            if st.events.len() >= MAX_BUFFERED {
                                st.events.pop_front();
                            }
                            st.events.push_back(v);
                        }
                        Err(e) => st.error = Some(e),
                    }
                }
                arrived.notify_one();
                if lock(&state).error.is_some() {
                    return;
                }
            }
        })
    };
    let n = watchers.next.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let id = format!("{nanos:08x}-{n}");
    let watcher = Arc::new(Watcher {
        sandbox: target.id.clone(),
        state,
        arrived,
        task: task.abort_handle(),
    });
    lock(&watchers.by_id).insert(id.clone(), watcher);
    Ok(json!({"watcherId": id}))
}

/// The sandbox's watcher named by the request; not_found otherwise.
fn watcher_of(
    watchers: &Watchers,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(String, Arc<Watcher>), RpcError> {
    let req: WatcherRequest = connect::decode(headers, body)?;
    let found = lock(&watchers.by_id)
        .get(&req.watcher_id)
        .filter(|w| w.sandbox == target.id)
        .cloned();
    match found {
        Some(w) => Ok((req.watcher_id, w)),
        None => Err(RpcError::new(
            Code::NotFound,
            format!("watcher with id {} not found", req.watcher_id),
        )),
    }
}

/// `GetWatcherEvents`: what happened since the last call; with nothing
/// yet, what comes within [`POLL_WAIT`], and with something, what follows
/// within [`SETTLE`] of it.
async fn watcher_events(
    watchers: &Watchers,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, RpcError> {
    let (_, watcher) = watcher_of(watchers, target, headers, body)?;
    let deadline = tokio::time::Instant::now() + POLL_WAIT;
    loop {
        let (empty, ended) = {
            let st = lock(&watcher.state);
            (st.events.is_empty(), st.error.is_some())
        };
        if ended || watcher.task.is_finished() {
            break;
        }
        // Nothing yet: wait for the first event. Something: a change
        // brings several (create, write), so wait while more keep coming.
        let until = if empty {
            deadline
        } else {
            deadline.min(tokio::time::Instant::now() + SETTLE)
        };
        // A wake-up left from events an earlier poll took returns at once;
        // the loop looks again.
        if tokio::time::timeout_at(until, watcher.arrived.notified())
            .await
            .is_err()
        {
            break;
        }
    }
    let mut st = lock(&watcher.state);
    if st.events.is_empty() {
        if let Some(e) = st.error.take() {
            return Err(e);
        }
    }
    let events: Vec<Value> = st.events.drain(..).collect();
    Ok(json!({"events": events}))
}

/// `RemoveWatcher`: stops the watch and forgets its events.
fn remove_watcher(
    watchers: &Watchers,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, RpcError> {
    let (id, _) = watcher_of(watchers, target, headers, body)?;
    lock(&watchers.by_id).remove(&id);
    Ok(json!({}))
}

/// envd's `EntryInfo` in proto3 JSON (int64 as a string, enums by name).
fn entry(e: &PathEntry, accounts: &Accounts) -> Value {
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
        "owner": accounts.user_name(e.uid),
        "group": accounts.group_name(e.gid),
    });
    if let Some(m) = modified {
        v["modifiedTime"] = json!(m);
    }
    if let Some(t) = &e.symlink_target {
        v["symlinkTarget"] = json!(t);
        v["isSymlink"] = json!(true);
    }
    let meta = super::files::metadata_of(&e.xattrs);
    if !meta.is_empty() {
        v["metadata"] = json!(meta);
    }
    v
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
            accessed_ms: None,
            changed_ms: None,
            symlink_target: None,
            xattrs: [("user.e2b.a".to_string(), "b".to_string())].into(),
        };
        let v = entry(&e, &Accounts::default());
        assert_eq!(v["name"], "a.txt");
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "3");
        assert_eq!(v["permissions"], "-rw-r--r--");
        assert_eq!(v["owner"], "root");
        assert_eq!(v["modifiedTime"], "2025-01-01T00:00:00Z");
        assert_eq!(v["metadata"], json!({"a": "b"}));
        assert_eq!(permissions(PathKind::Dir, 0o755), "drwxr-xr-x");
    }
}

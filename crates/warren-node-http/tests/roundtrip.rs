//! The HTTP transport end to end: an in-memory node behind `router`,
//! driven through `HttpNode`, over real sockets on 127.0.0.1.

// Tests may unwrap (clippy.toml covers only #[test] functions).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use futures_util::stream::{self, BoxStream};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use warren_core::spec::{NetworkMode, NetworkSpec};
use warren_core::{ExecEvent, ExecRequest, ResolvedResources, SandboxSpec, Usage};
use warren_node_api::*;
use warren_node_http::{router, Fence, HttpNode};

const CREDENTIAL: &str = "node-credential-0123456789abcdef";
const ECHO_PORT: u16 = 7;
const MIB: usize = 1 << 20;

// ---------------------------------------------------------------- the fake

#[derive(Default)]
struct Upload {
    chunks: usize,
    largest_chunk: usize,
    bytes: u64,
}

struct Stored {
    dir: bool,
    chunks: Vec<Bytes>,
}

struct FakeNode {
    sandboxes: Mutex<BTreeMap<String, SandboxStatus>>,
    files: Mutex<HashMap<(String, String), Stored>>,
    feed: Arc<Mutex<Vec<Sequenced>>>,
    feed_tx: watch::Sender<u64>,
    calls: Mutex<Vec<String>>,
    echo: SocketAddr,
    exec_killed: Arc<AtomicBool>,
    last_upload: Mutex<Upload>,
    /// Creates of ids starting with "slow" wait until this is true.
    slow_gate: watch::Sender<bool>,
}

fn status_of(id: &str) -> SandboxStatus {
    SandboxStatus {
        id: id.to_string(),
        phase: Phase::Running,
        image_digest: "sha256:abc".into(),
        pid: 4242,
        host_id_base: Some(100_000),
        ttl_remaining_ms: 60_000,
        lease_remaining_ms: None,
        usage: Some(usage()),
        phases: vec![warren_node_api::PhaseTiming {
            phase: "runtime_create".into(),
            micros: 1234,
            start_micros: Some(56),
        }],
    }
}

fn usage() -> Usage {
    Usage {
        cpu_usage_ns: 42,
        memory_bytes: 1 << 20,
        runtime_ms: 1234,
        ..Default::default()
    }
}

fn image(name: &str) -> ImageInfo {
    ImageInfo {
        name: name.to_string(),
        digest: format!("sha256:{:0>64}", name.len()),
        layers: 2,
        record: serde_json::json!({"source": "fake", "name": name}),
    }
}

/// Notes that an exec's stream was dropped (the node's kill).
struct KillOnDrop(Arc<AtomicBool>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl FakeNode {
    fn new(echo: SocketAddr) -> FakeNode {
        let mut sandboxes = BTreeMap::new();
        sandboxes.insert("sb-1".to_string(), status_of("sb-1"));
        FakeNode {
            sandboxes: Mutex::new(sandboxes),
            files: Mutex::new(HashMap::new()),
            feed: Arc::new(Mutex::new(Vec::new())),
            feed_tx: watch::channel(0).0,
            calls: Mutex::new(Vec::new()),
            echo,
            exec_killed: Arc::new(AtomicBool::new(false)),
            last_upload: Mutex::new(Upload::default()),
            slow_gate: watch::Sender::new(false),
        }
    }

    fn push(&self, seq: u64, event: NodeEvent) {
        self.feed.lock().unwrap().push(Sequenced { seq, event });
        self.feed_tx.send_replace(seq);
    }

    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn need(&self, id: &str) -> NodeResult<()> {
        if self.sandboxes.lock().unwrap().contains_key(id) {
            Ok(())
        } else {
            Err(NodeError::not_found(format!(
                "no sandbox {id:?} on this node"
            )))
        }
    }

    async fn drain(&self, mut body: ByteStream) -> NodeResult<Vec<Bytes>> {
        let mut chunks = Vec::new();
        let mut upload = Upload::default();
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            upload.chunks += 1;
            upload.largest_chunk = upload.largest_chunk.max(chunk.len());
            upload.bytes += chunk.len() as u64;
            chunks.push(chunk);
        }
        *self.last_upload.lock().unwrap() = upload;
        Ok(chunks)
    }
}

#[async_trait::async_trait]
impl NodeApi for FakeNode {
    async fn info(&self) -> NodeResult<NodeInfo> {
        Ok(NodeInfo {
            name: "fake-1".into(),
            labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
            allocatable: Resources {
                cpu_millis: 8000,
                memory: 16 << 30,
                slots: 32,
                gpus: 2,
            },
            max_pids: 4096,
            load: Load {
                cpu_busy: 0.25,
                disk_pressure: false,
                memory_pressure: false,
                sandboxes: 1,
            },
            images: vec!["sha256:aa".into()],
            devices: vec![warren_node_api::DeviceClass {
                kind: "nvidia.com/gpu".into(),
                devices: vec!["nvidia.com/gpu=0".into(), "nvidia.com/gpu=1".into()],
                used: vec!["nvidia.com/gpu=1".into()],
                gpu: true,
            }],
            isolation: vec![
                warren_core::Isolation::Gvisor,
                warren_core::Isolation::Container,
            ],
        })
    }

    async fn inventory(&self) -> NodeResult<Vec<SandboxStatus>> {
        Ok(self.sandboxes.lock().unwrap().values().cloned().collect())
    }

    async fn status(&self, id: &str, read_usage: bool) -> NodeResult<SandboxStatus> {
        self.record(format!("status {id} {read_usage}"));
        self.need(id)?;
        Ok(self.sandboxes.lock().unwrap()[id].clone())
    }

    async fn events(&self, since: u64) -> NodeResult<BoxStream<'static, Sequenced>> {
        // Subscribed before the first look, so nothing pushed in between
        // is missed.
        let rx = self.feed_tx.subscribe();
        let shared = self.feed.clone();
        Ok(
            stream::unfold((since, rx, shared), |(last, mut rx, shared)| async move {
                loop {
                    let next = shared
                        .lock()
                        .unwrap()
                        .iter()
                        .find(|e| e.seq > last)
                        .cloned();
                    if let Some(e) = next {
                        let seq = e.seq;
                        return Some((e, (seq, rx, shared)));
                    }
                    rx.changed().await.ok()?;
                }
            })
            .boxed(),
        )
    }

    async fn create(&self, req: CreateSandbox) -> NodeResult<SandboxStatus> {
        if req.id == "full" {
            return Err(NodeError::new(
                ErrorKind::NoRoom,
                "no slot left: 32 of 32 in use",
            ));
        }
        if req.id.starts_with("slow") {
            self.record(format!("creating {}", req.id));
            let mut gate = self.slow_gate.subscribe();
            gate.wait_for(|open| *open).await.unwrap();
        }
        let mut sandboxes = self.sandboxes.lock().unwrap();
        if sandboxes.contains_key(&req.id) {
            return Err(NodeError::conflict(format!("sandbox {} exists", req.id)));
        }
        self.record(format!(
            "create {} {} {} {} {:?} {:?}",
            req.id,
            req.spec.image,
            req.resources.cpu_millis,
            req.image_digest,
            req.devices,
            req.device_env
        ));
        let mut st = status_of(&req.id);
        st.image_digest = req.image_digest;
        sandboxes.insert(req.id, st.clone());
        Ok(st)
    }

    async fn start_main(&self, id: &str) -> NodeResult<()> {
        self.need(id)?;
        self.record(format!("start_main {id}"));
        Ok(())
    }

    async fn destroy(&self, id: &str, why: &str) -> NodeResult<Option<Usage>> {
        self.record(format!("destroy {id} {why}"));
        Ok(self.sandboxes.lock().unwrap().remove(id).map(|_| usage()))
    }

    async fn set_paused(&self, id: &str, paused: bool) -> NodeResult<()> {
        self.need(id)?;
        self.record(format!("set_paused {id} {paused}"));
        let phase = if paused {
            Phase::Paused
        } else {
            Phase::Running
        };
        if let Some(s) = self.sandboxes.lock().unwrap().get_mut(id) {
            s.phase = phase;
        }
        Ok(())
    }

    async fn hold(&self, id: &str, hold_for: Duration, note: LogNote) -> NodeResult<Option<Usage>> {
        self.need(id)?;
        self.record(format!(
            "hold {id} {} {}/{}/{}",
            hold_for.as_millis(),
            note.state,
            note.reason,
            note.message
        ));
        Ok(Some(usage()))
    }

    async fn set_ttl(&self, id: &str, ttl: Duration) -> NodeResult<()> {
        self.need(id)?;
        self.record(format!("set_ttl {id} {}", ttl.as_millis()));
        Ok(())
    }

    async fn claim(&self, id: &str, spec: SandboxSpec) -> NodeResult<SandboxStatus> {
        self.need(id)?;
        self.record(format!("claim {id} {}", spec.labels.len()));
        Ok(self.sandboxes.lock().unwrap()[id].clone())
    }

    async fn renew_lease(&self, id: &str) -> NodeResult<()> {
        self.record(format!("renew_lease {id}"));
        Ok(())
    }

    async fn note(&self, id: &str, note: LogNote) -> NodeResult<()> {
        self.need(id)?;
        self.record(format!("note {id} {}/{}", note.state, note.reason));
        Ok(())
    }

    async fn exec(&self, id: &str, req: ExecRequest) -> NodeResult<BoxStream<'static, ExecEvent>> {
        self.need(id)?;
        let start = ExecEvent::Start {
            exec_id: "ex-1".into(),
            pid: 7,
        };
        match req.cmd.first().map(String::as_str) {
            Some("hang") => {
                // Like the node: keepalives while the command is quiet.
                let guard = KillOnDrop(self.exec_killed.clone());
                let ticks = stream::unfold(guard, |guard| async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Some((ExecEvent::Keepalive, guard))
                });
                Ok(stream::once(async { start }).chain(ticks).boxed())
            }
            Some("many") => {
                let n: usize = req.cmd[1].parse().unwrap();
                let events: Vec<ExecEvent> =
                    std::iter::once(start)
                        .chain((0..n).map(|i| {
                            ExecEvent::output(i % 2 == 1, format!("line {i}\n").as_bytes())
                        }))
                        .chain(std::iter::once(ExecEvent::Exit {
                            code: 0,
                            signal: None,
                            timed_out: false,
                            duration_ms: 5,
                        }))
                        .collect();
                Ok(stream::iter(events).boxed())
            }
            _ => {
                let mut events = vec![
                    start,
                    ExecEvent::output(false, req.cmd.join(" ").as_bytes()),
                ];
                if let Some(stdin) = &req.stdin {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(stdin)
                        .unwrap();
                    events.push(ExecEvent::output(true, &bytes));
                }
                events.push(ExecEvent::Exit {
                    code: 3,
                    signal: None,
                    timed_out: false,
                    duration_ms: 12,
                });
                Ok(stream::iter(events).boxed())
            }
        }
    }

    async fn write_file(&self, id: &str, req: WriteFile, body: ByteStream) -> NodeResult<()> {
        // Refused before a byte of the body is read, as the node does.
        self.need(id)?;
        if req.path.contains("..") {
            return Err(NodeError::invalid(format!(
                "path {:?} leaves the sandbox",
                req.path
            )));
        }
        let chunks = self.drain(body).await?;
        self.record(format!(
            "write_file {id} {} {:o} {} {:?}",
            req.path, req.mode, req.tar, req.xattrs
        ));
        self.files.lock().unwrap().insert(
            (id.to_string(), req.path),
            Stored {
                dir: req.tar,
                chunks,
            },
        );
        Ok(())
    }

    async fn exec_input(
        &self,
        id: &str,
        exec_id: &str,
        data: Bytes,
        close: bool,
    ) -> NodeResult<()> {
        self.need(id)?;
        if exec_id == "ended" {
            return Err(NodeError::conflict(
                "exec ended has ended; its stdin is closed",
            ));
        }
        self.record(format!(
            "exec_input {id} {exec_id} {} {close}",
            String::from_utf8_lossy(&data)
        ));
        Ok(())
    }

    async fn exec_resize(
        &self,
        id: &str,
        exec_id: &str,
        size: warren_core::WindowSize,
    ) -> NodeResult<()> {
        self.need(id)?;
        match exec_id {
            "ended" => Err(NodeError::not_found("no running exec ended")),
            "plain" => Err(NodeError::conflict("exec plain has no terminal to resize")),
            _ => {
                self.record(format!(
                    "exec_resize {id} {exec_id} {}x{}",
                    size.rows, size.cols
                ));
                Ok(())
            }
        }
    }

    async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> NodeResult<BoxStream<'static, WatchEvent>> {
        self.need(id)?;
        if path == "/missing" {
            return Err(NodeError::not_found("/missing: no such file or directory"));
        }
        let mut events = vec![
            WatchEvent::Event {
                name: "a b.txt".into(),
                kind: WatchKind::Create,
            },
            WatchEvent::Event {
                name: "sub/c".into(),
                kind: WatchKind::Rename,
            },
        ];
        if recursive {
            events.push(WatchEvent::Error {
                error: NodeError::invalid(format!("{path}: more than 4096 directories")),
            });
        }
        Ok(stream::iter(events).boxed())
    }

    async fn path_op(&self, id: &str, op: PathOp) -> NodeResult<Vec<PathEntry>> {
        self.need(id)?;
        self.record(format!(
            "path_op {id} {}",
            serde_json::to_string(&op).unwrap()
        ));
        let entry = |path: &str, kind| PathEntry {
            path: path.into(),
            kind,
            size: 3,
            mode: 0o644,
            uid: 0,
            gid: 1000,
            modified_ms: 1_700_000_000_123,
            accessed_ms: None,
            changed_ms: Some(1_700_000_000_456),
            symlink_target: (kind == PathKind::Symlink).then(|| "/etc".into()),
            xattrs: Default::default(),
        };
        Ok(match op {
            PathOp::List { path, .. } => vec![
                entry(&format!("{path}/a"), PathKind::File),
                entry(&format!("{path}/l"), PathKind::Symlink),
            ],
            PathOp::Remove { .. } => vec![],
            PathOp::MakeDir { path } if path == "/exists" => {
                return Err(NodeError::conflict("/exists: already exists"))
            }
            _ => vec![entry("/x", PathKind::Dir)],
        })
    }

    async fn read_file(&self, id: &str, path: &str) -> NodeResult<FileRead> {
        self.need(id)?;
        let files = self.files.lock().unwrap();
        let stored = files
            .get(&(id.to_string(), path.to_string()))
            .ok_or_else(|| NodeError::not_found(format!("no file {path} in sandbox {id}")))?;
        let size = stored.chunks.iter().map(|c| c.len() as u64).sum();
        let kind = if stored.dir {
            FileKind::Dir
        } else {
            FileKind::File { size }
        };
        let chunks = stored.chunks.clone();
        Ok(FileRead {
            kind,
            body: stream::iter(chunks.into_iter().map(Ok)).boxed(),
        })
    }

    async fn ship(
        &self,
        journal: Option<&str>,
        after: u64,
        max: u32,
        wait: Duration,
    ) -> NodeResult<ShipBatch> {
        self.record(format!(
            "ship {journal:?} {after} {max} {}",
            wait.as_millis()
        ));
        let entries = vec![Shipped {
            seq: after + 1,
            sandbox_id: "sb-2".into(),
            kind: ShippedKind::Log,
            time_ms: 1_700_000_000_000,
            body: r#"{"kind":"stdout","text":"tab\there\n"}"#.into(),
        }];
        Ok(ShipBatch {
            journal: "j-1".into(),
            last: after + 1,
            entries,
            dropped: 2,
        })
    }

    async fn logs(&self, id: &str, follow: bool) -> NodeResult<ByteStream> {
        self.need(id)?;
        let first = Bytes::from_static(b"{\"line\":1}\n{\"line\":2}\n");
        if !follow {
            return Ok(stream::once(async { Ok(first) }).boxed());
        }
        let later = stream::unfold(3, |n| async move {
            if n > 5 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some((Ok(Bytes::from(format!("{{\"line\":{n}}}\n"))), n + 1))
        });
        Ok(stream::once(async { Ok(first) }).chain(later).boxed())
    }

    async fn connect_port(&self, id: &str, port: u16) -> NodeResult<Box<dyn Tunnel>> {
        self.need(id)?;
        if port != ECHO_PORT {
            return Err(NodeError::conflict(format!(
                "nothing listens on port {port} in sandbox {id}"
            )));
        }
        let conn = TcpStream::connect(self.echo)
            .await
            .map_err(|e| NodeError::internal(e.to_string()))?;
        Ok(Box::new(conn))
    }

    async fn check_network(&self, network: NetworkSpec) -> NodeResult<()> {
        if network.allow.iter().any(|r| r == "bad") {
            return Err(NodeError::invalid(
                "rule \"bad\" has no port: write HOST:PORT",
            ));
        }
        self.record(format!("check_network {}", network.allow.join(",")));
        Ok(())
    }

    async fn set_network(&self, id: &str, network: NetworkSpec) -> NodeResult<PolicyChange> {
        self.need(id)?;
        Ok(PolicyChange {
            closed: network.deny.clone(),
            unlistened: vec![8080],
        })
    }

    async fn commit(&self, id: &str, req: CommitImage) -> NodeResult<ImageInfo> {
        self.need(id)?;
        let ImageTarget::Name(name) = &req.into else {
            return Ok(image(&format!(
                "step:{}",
                req.created_by.unwrap_or_default()
            )));
        };
        Ok(image(name))
    }

    async fn image_derive(&self, req: DeriveImage) -> NodeResult<ImageInfo> {
        let ImageTarget::Step(key) = &req.into else {
            return Ok(image(&req.base));
        };
        let settings = serde_json::to_string(&req.settings).unwrap();
        Ok(image(&format!("{key}:{settings}")))
    }

    async fn image_step(&self, key: &str) -> NodeResult<Option<ImageInfo>> {
        Ok((key == "known").then(|| image("step")))
    }

    async fn fork_layer(&self, id: &str, processes: bool) -> NodeResult<ForkLayer> {
        self.need(id)?;
        self.record(format!("fork_layer {id} {processes}"));
        Ok(ForkLayer {
            layers: vec!["fk-000000000002".into(), "fk-000000000001".into()],
            bytes: 50 << 20,
            entries: 1201,
            frozen_ms: 37,
            memory_bytes: if processes { 650_000 } else { 0 },
        })
    }

    async fn release_fork_layer(&self, layer: &str) -> NodeResult<()> {
        self.record(format!("release_fork_layer {layer}"));
        Ok(())
    }

    async fn image_list(&self) -> NodeResult<Vec<ImageInfo>> {
        Ok(vec![image("base:1"), image("tools:2")])
    }

    async fn image_for_create(&self, reference: &str) -> NodeResult<ImageInfo> {
        if reference == "missing:1" {
            return Err(NodeError::not_found(format!("no image {reference}")));
        }
        Ok(image(reference))
    }

    async fn image_pull(&self, reference: &str) -> NodeResult<BoxStream<'static, PullUpdate>> {
        let progress = |n: u64| PullUpdate::Progress {
            event: serde_json::json!({"type": "progress", "done": n}),
        };
        let end = if reference == "broken:1" {
            PullUpdate::Error {
                error: NodeError::new(ErrorKind::Upstream, "registry answered 500"),
            }
        } else {
            PullUpdate::Image {
                image: image(reference),
            }
        };
        Ok(stream::iter(vec![progress(1), progress(2), end]).boxed())
    }

    async fn image_import(&self, name: &str, archive: ByteStream) -> NodeResult<ImageInfo> {
        let chunks = self.drain(archive).await?;
        let mut info = image(name);
        info.record = serde_json::json!({
            "bytes": chunks.iter().map(|c| c.len()).sum::<usize>(),
        });
        Ok(info)
    }

    async fn image_push(&self, reference: &str, source: Option<&str>) -> NodeResult<Pushed> {
        if reference.starts_with("denied") {
            return Err(NodeError::new(
                ErrorKind::Upstream,
                "registry refused the push: 403",
            ));
        }
        Ok(Pushed {
            image: image(source.unwrap_or(reference)),
            uploaded: 3,
            mounted: usize::from(source.is_some()),
        })
    }

    async fn image_remove(&self, reference: &str) -> NodeResult<ImageInfo> {
        if reference == "busy:1" {
            return Err(NodeError::conflict(
                "image busy:1 is in use by sandbox sb-1",
            ));
        }
        Ok(image(reference))
    }

    async fn image_gc(&self, budget: Option<u64>) -> NodeResult<GcReport> {
        Ok(GcReport {
            removed: vec!["old:1".into()],
            used_before: 1000,
            used_after: budget.unwrap_or(0),
        })
    }

    async fn volume_create(
        &self,
        req: warren_core::volume::VolumeRequest,
    ) -> NodeResult<warren_core::volume::VolumeInfo> {
        self.record(format!("volume_create {} {}", req.name, req.size.bytes()));
        Ok(volume(req.name.as_str()))
    }

    async fn volume_list(&self) -> NodeResult<Vec<warren_core::volume::VolumeInfo>> {
        Ok(vec![volume("ds")])
    }

    async fn volume_remove(
        &self,
        name: &warren_core::volume::VolumeName,
    ) -> NodeResult<warren_core::volume::VolumeInfo> {
        if name.as_str() == "busy" {
            return Err(NodeError::conflict("volume busy is mounted by sb-1"));
        }
        Ok(volume(name.as_str()))
    }

    async fn volume_write(
        &self,
        volume: &warren_core::volume::VolumeName,
        req: VolumeWrite,
        body: ByteStream,
    ) -> NodeResult<PathEntry> {
        if req.file.path == "/exists" && !req.replace {
            return Err(NodeError::conflict("/exists: already exists"));
        }
        let chunks = self.drain(body).await?;
        self.record(format!(
            "volume_write {volume} {} {:o} {}:{} {} {:?}",
            req.file.path,
            req.file.mode,
            req.owner.uid,
            req.owner.gid,
            req.replace,
            req.file.xattrs
        ));
        let size = chunks.iter().map(|c| c.len() as u64).sum();
        self.files.lock().unwrap().insert(
            (format!("volume {volume}"), req.file.path.clone()),
            Stored { dir: false, chunks },
        );
        Ok(PathEntry {
            path: req.file.path,
            kind: PathKind::File,
            size,
            mode: req.file.mode,
            uid: req.owner.uid,
            gid: req.owner.gid,
            modified_ms: 1,
            accessed_ms: Some(2),
            changed_ms: Some(3),
            symlink_target: None,
            xattrs: req.file.xattrs,
        })
    }

    async fn volume_read(
        &self,
        volume: &warren_core::volume::VolumeName,
        path: &str,
    ) -> NodeResult<FileRead> {
        let files = self.files.lock().unwrap();
        let stored = files
            .get(&(format!("volume {volume}"), path.to_string()))
            .ok_or_else(|| NodeError::not_found(format!("{path}: not in volume {volume}")))?;
        let size = stored.chunks.iter().map(|c| c.len() as u64).sum();
        let chunks = stored.chunks.clone();
        Ok(FileRead {
            kind: FileKind::File { size },
            body: stream::iter(chunks.into_iter().map(Ok)).boxed(),
        })
    }

    async fn volume_path_op(
        &self,
        volume: &warren_core::volume::VolumeName,
        op: PathOp,
    ) -> NodeResult<Vec<PathEntry>> {
        self.record(format!(
            "volume_path_op {volume} {}",
            serde_json::to_string(&op).unwrap()
        ));
        match op {
            PathOp::SetAttrs { path, .. } if path == "/missing" => {
                Err(NodeError::not_found("/missing: not in the volume"))
            }
            _ => Ok(vec![]),
        }
    }
}

fn volume(name: &str) -> warren_core::volume::VolumeInfo {
    warren_core::volume::VolumeInfo {
        name: warren_core::volume::VolumeName::try_from(name.to_string()).unwrap(),
        size: 1 << 30,
        used: 4096,
        node: "n1".into(),
        created_at: "2026-12-06T00:00:00Z".into(),
        mounted_by: Vec::new(),
    }
}

// ---------------------------------------------------------------- harness

struct Harness {
    fake: Arc<FakeNode>,
    node: HttpNode,
    addr: SocketAddr,
}

async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn serve(fake: Arc<FakeNode>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(fake, CREDENTIAL.to_string(), Fence::default());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn start() -> Harness {
    let fake = Arc::new(FakeNode::new(echo_server().await));
    let addr = serve(fake.clone()).await;
    let node = HttpNode::new(&format!("http://{addr}"), CREDENTIAL).unwrap();
    Harness { fake, node, addr }
}

/// A TCP relay between client and node whose connections the test can cut.
struct Relay {
    addr: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    async fn to(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accepted = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let relay = tokio::spawn(async move {
                    let mut upstream = TcpStream::connect(target).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                });
                accepted.lock().unwrap().push(relay);
            }
        });
        tasks.lock().unwrap().push(accept);
        Relay { addr, tasks }
    }

    fn cut(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

fn note(state: &str) -> LogNote {
    LogNote {
        state: state.into(),
        reason: "test".into(),
        message: "a note with \"quotes\" & ünïcode".into(),
    }
}

async fn next_within<S: futures_util::Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .expect("stream stalled")
}

async fn read_all(mut body: ByteStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

fn create_req(id: &str) -> CreateSandbox {
    CreateSandbox {
        id: id.into(),
        spec: SandboxSpec {
            image: "base:1".into(),
            cmd: Some(vec!["sleep".into(), "infinity".into()]),
            ..Default::default()
        },
        resources: ResolvedResources {
            cpu_millis: 500,
            memory: 256 << 20,
            pids: 128,
            disk: 0,
            gpus: 0,
            cpu_request_millis: Some(100),
            memory_request: Some(64 << 20),
        },
        image_digest: "sha256:feed".into(),
        image_source: None,
        devices: vec!["nvidia.com/gpu=1".into()],
        device_env: BTreeMap::from([("NVIDIA_VISIBLE_DEVICES".to_string(), "void".to_string())]),
        secrets: Vec::new(),
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_crosses_the_wire() {
    let Harness { fake, node, .. } = start().await;

    let info = node.info().await.unwrap();
    assert_eq!(info, fake.info().await.unwrap());

    let created = node.create(create_req("sb-2")).await.unwrap();
    assert_eq!(
        (created.id.as_str(), created.phase),
        ("sb-2", Phase::Running),
        "create answers the new sandbox's status"
    );
    let inventory = node.inventory().await.unwrap();
    assert_eq!(
        inventory.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["sb-1", "sb-2"]
    );
    let st = node.status("sb-2", true).await.unwrap();
    assert_eq!(st, fake.status("sb-2", true).await.unwrap());
    assert_eq!(node.status("sb-2", false).await.unwrap(), st);
    assert_eq!(st.image_digest, "sha256:feed");

    node.start_main("sb-2").await.unwrap();
    node.set_paused("sb-2", true).await.unwrap();
    assert_eq!(
        node.status("sb-2", true).await.unwrap().phase,
        Phase::Paused
    );
    node.set_paused("sb-2", false).await.unwrap();
    let held = node
        .hold("sb-2", Duration::from_millis(90_500), note("kept"))
        .await
        .unwrap();
    assert_eq!(held, Some(usage()));
    node.set_ttl("sb-2", Duration::from_secs(600))
        .await
        .unwrap();
    node.renew_lease("sb-2").await.unwrap();
    node.renew_lease("nobody").await.unwrap();
    let claimed = node
        .claim(
            "sb-2",
            SandboxSpec {
                image: "bb".into(),
                labels: [("task".to_string(), "t".to_string())].into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(claimed.id, "sb-2", "a claim answers the sandbox's status");
    node.note("sb-2", note("running")).await.unwrap();

    // exec: argv and stdin come back as output, then the exit.
    let req = ExecRequest {
        cmd: vec!["echo".into(), "hi there".into()],
        stdin: Some(base64::engine::general_purpose::STANDARD.encode(b"from stdin")),
        ..Default::default()
    };
    let events: Vec<ExecEvent> = node.exec("sb-2", req).await.unwrap().collect().await;
    assert!(matches!(events[0], ExecEvent::Start { pid: 7, .. }));
    assert_eq!(events[1].output_bytes().unwrap(), b"echo hi there");
    assert!(matches!(events[2], ExecEvent::Stderr { .. }));
    assert_eq!(events[2].output_bytes().unwrap(), b"from stdin");
    assert!(matches!(events[3], ExecEvent::Exit { code: 3, .. }));
    assert_eq!(events.len(), 4);

    // Files: a file, then a directory (a tar body).
    let body: ByteStream = stream::iter(vec![
        Ok(Bytes::from_static(b"hello, ")),
        Ok(Bytes::from_static(b"world\n")),
    ])
    .boxed();
    let write = WriteFile {
        path: "/work/hello.txt".into(),
        mode: 0o640,
        tar: false,
        xattrs: [("user.e2b.k".to_string(), "v &=?".to_string())].into(),
    };
    node.write_file("sb-2", write, body).await.unwrap();
    let read = node.read_file("sb-2", "/work/hello.txt").await.unwrap();
    assert_eq!(read.kind, FileKind::File { size: 13 });
    assert_eq!(read_all(read.body).await, b"hello, world\n");

    let tar: ByteStream = stream::iter(vec![Ok(Bytes::from(vec![7u8; 3000]))]).boxed();
    let write = WriteFile {
        path: "/work/dir".into(),
        mode: 0o755,
        tar: true,
        xattrs: Default::default(),
    };
    node.write_file("sb-2", write, tar).await.unwrap();
    let read = node.read_file("sb-2", "/work/dir").await.unwrap();
    assert_eq!(read.kind, FileKind::Dir);
    assert_eq!(read_all(read.body).await, vec![7u8; 3000]);

    // Logs, whole and followed until the sandbox is over.
    let logs = read_all(node.logs("sb-2", false).await.unwrap()).await;
    assert_eq!(logs, b"{\"line\":1}\n{\"line\":2}\n");
    let followed = read_all(node.logs("sb-2", true).await.unwrap()).await;
    assert_eq!(String::from_utf8(followed).unwrap().lines().count(), 5);

    // Tunnel.
    let mut tunnel = node.connect_port("sb-2", ECHO_PORT).await.unwrap();
    tunnel.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    tunnel.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
    drop(tunnel);

    // Stdin sent to a running exec, and to one that ended.
    node.exec_input("sb-2", "ex-1", Bytes::from_static(b"line\n"), true)
        .await
        .unwrap();
    let ended = node
        .exec_input("sb-2", "ended", Bytes::new(), false)
        .await
        .unwrap_err();
    assert_eq!(ended.kind, ErrorKind::Conflict);

    // A terminal resized; one that ended, one without a terminal.
    let size = |rows, cols| warren_core::WindowSize { rows, cols };
    node.exec_resize("sb-2", "ex-1", size(50, 132))
        .await
        .unwrap();
    let ended = node
        .exec_resize("sb-2", "ended", size(1, 1))
        .await
        .unwrap_err();
    assert_eq!(ended.kind, ErrorKind::NotFound);
    assert!(ended.message.contains("no running exec"), "{ended:?}");
    let plain = node
        .exec_resize("sb-2", "plain", size(1, 1))
        .await
        .unwrap_err();
    assert_eq!(plain.kind, ErrorKind::Conflict);

    // Paths.
    let listed = node
        .path_op(
            "sb-2",
            PathOp::List {
                path: "/w".into(),
                depth: 2,
            },
        )
        .await
        .unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1].symlink_target.as_deref(), Some("/etc"));
    assert_eq!(listed[0].modified_ms, 1_700_000_000_123);
    assert!(node
        .path_op("sb-2", PathOp::Remove { path: "/w".into() })
        .await
        .unwrap()
        .is_empty());
    let exists = node
        .path_op(
            "sb-2",
            PathOp::MakeDir {
                path: "/exists".into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(exists.kind, ErrorKind::Conflict);

    // Directory watches: events as NDJSON, the error that ends one, and a
    // refusal before any event.
    let events: Vec<WatchEvent> = node
        .watch("sb-2", "/w", false)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(
        events,
        vec![
            WatchEvent::Event {
                name: "a b.txt".into(),
                kind: WatchKind::Create
            },
            WatchEvent::Event {
                name: "sub/c".into(),
                kind: WatchKind::Rename
            },
        ]
    );
    let events: Vec<WatchEvent> = node
        .watch("sb-2", "/w", true)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(events.len(), 3);
    match &events[2] {
        WatchEvent::Error { error } => {
            assert_eq!(error.kind, ErrorKind::Invalid);
            assert!(error.message.contains("more than 4096"), "{error:?}");
        }
        other => panic!("expected the error last, got {other:?}"),
    }
    let missing = node.watch("sb-2", "/missing", false).await.err().unwrap();
    assert_eq!(missing.kind, ErrorKind::NotFound);

    // Network.
    let spec = NetworkSpec {
        mode: NetworkMode::Allowlist,
        allow: vec!["pypi.org:443".into()],
        deny: vec!["10.0.0.0/8:22".into()],
    };
    node.check_network(spec.clone()).await.unwrap();
    let change = node.set_network("sb-2", spec).await.unwrap();
    assert_eq!(
        change,
        PolicyChange {
            closed: vec!["10.0.0.0/8:22".into()],
            unlistened: vec![8080]
        }
    );

    // Forks.
    assert_eq!(
        node.fork_layer("sb-2", true).await.unwrap(),
        ForkLayer {
            layers: vec!["fk-000000000002".into(), "fk-000000000001".into()],
            bytes: 50 << 20,
            entries: 1201,
            frozen_ms: 37,
            memory_bytes: 650_000,
        }
    );
    assert_eq!(
        node.fork_layer("nobody", false).await.unwrap_err().kind,
        ErrorKind::NotFound
    );
    node.release_fork_layer("fk-000000000002").await.unwrap();

    // Images.
    let commit = |into| CommitImage {
        into,
        created_by: Some("RUN true".into()),
    };
    assert_eq!(
        node.commit("sb-2", commit(ImageTarget::Name("mine:1".into())))
            .await
            .unwrap(),
        image("mine:1")
    );
    assert_eq!(
        node.commit("sb-2", commit(ImageTarget::Step("k".into())))
            .await
            .unwrap(),
        image("step:RUN true")
    );
    let settings = warren_core::build::ImageSettings {
        cmd: Some(vec!["sh".into()]),
        ..Default::default()
    };
    assert_eq!(
        node.image_derive(DeriveImage {
            base: "base:1".into(),
            into: ImageTarget::Step("k2".into()),
            settings: Some(settings),
            created_by: None,
        })
        .await
        .unwrap(),
        image(r#"k2:{"cmd":["sh"]}"#)
    );
    assert_eq!(node.image_step("known").await.unwrap(), Some(image("step")));
    assert_eq!(node.image_step("other").await.unwrap(), None);
    assert_eq!(
        node.image_list().await.unwrap(),
        vec![image("base:1"), image("tools:2")]
    );
    assert_eq!(
        node.image_for_create("base:1").await.unwrap(),
        image("base:1")
    );
    let updates: Vec<PullUpdate> = node.image_pull("base:2").await.unwrap().collect().await;
    assert_eq!(updates.len(), 3);
    assert!(matches!(&updates[0], PullUpdate::Progress { event } if event["done"] == 1));
    assert_eq!(
        updates[2],
        PullUpdate::Image {
            image: image("base:2")
        }
    );
    let archive: ByteStream =
        stream::iter((0..4).map(|_| Ok(Bytes::from(vec![1u8; 100_000])))).boxed();
    let imported = node.image_import("imported:1", archive).await.unwrap();
    assert_eq!(imported.record["bytes"], 400_000);
    let pushed = node
        .image_push("registry.local/mine:1", Some("mine:1"))
        .await
        .unwrap();
    assert_eq!((pushed.uploaded, pushed.mounted), (3, 1));
    assert_eq!(pushed.image, image("mine:1"));
    let pushed = node.image_push("registry.local/x:1", None).await.unwrap();
    assert_eq!(pushed.mounted, 0);
    assert_eq!(node.image_remove("old:1").await.unwrap(), image("old:1"));
    let gc = node.image_gc(Some(500)).await.unwrap();
    assert_eq!((gc.used_before, gc.used_after), (1000, 500));
    assert_eq!(node.image_gc(None).await.unwrap().used_after, 0);

    // The shipping journal's batch, its body a JSON line kept as text.
    let batch = node
        .ship(Some("j-1"), 41, 500, Duration::from_millis(1500))
        .await
        .unwrap();
    assert_eq!(
        (batch.journal.as_str(), batch.last, batch.dropped),
        ("j-1", 42, 2)
    );
    assert_eq!(
        batch.entries[0].body,
        r#"{"kind":"stdout","text":"tab\there\n"}"#
    );
    assert_eq!(batch.entries[0].kind, ShippedKind::Log);

    // Destroy answers the final usage, and nothing when already gone.
    let why = "user asked: a&b=c/d ?#%";
    assert_eq!(node.destroy("sb-2", why).await.unwrap(), Some(usage()));
    assert_eq!(node.destroy("sb-2", why).await.unwrap(), None);

    // The arguments arrived as sent.
    let calls = fake.calls();
    for expected in [
        r#"create sb-2 base:1 500 sha256:feed ["nvidia.com/gpu=1"] {"NVIDIA_VISIBLE_DEVICES": "void"}"#.to_string(),
        "start_main sb-2".into(),
        "set_paused sb-2 true".into(),
        "set_paused sb-2 false".into(),
        "hold sb-2 90500 kept/test/a note with \"quotes\" & ünïcode".into(),
        "set_ttl sb-2 600000".into(),
        "renew_lease sb-2".into(),
        "renew_lease nobody".into(),
        "claim sb-2 1".into(),
        "status sb-2 true".into(),
        "status sb-2 false".into(),
        "note sb-2 running/test".into(),
        "write_file sb-2 /work/hello.txt 640 false {\"user.e2b.k\": \"v &=?\"}".into(),
        "write_file sb-2 /work/dir 755 true {}".into(),
        "check_network pypi.org:443".into(),
        r#"path_op sb-2 {"op":"list","path":"/w","depth":2}"#.into(),
        "exec_input sb-2 ex-1 line\n true".into(),
        "exec_resize sb-2 ex-1 50x132".into(),
        "fork_layer sb-2 true".into(),
        "release_fork_layer fk-000000000002".into(),
        r#"ship Some("j-1") 41 500 1500"#.into(),
        format!("destroy sb-2 {why}"),
    ] {
        assert!(calls.contains(&expected), "{expected:?} not in {calls:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_files_cross_the_wire() {
    let Harness { fake, node, .. } = start().await;
    let ds = warren_core::volume::VolumeName::try_from("ds".to_string()).unwrap();
    let body: ByteStream = stream::iter(vec![
        Ok(Bytes::from_static(b"rows ")),
        Ok(Bytes::from_static(b"& more")),
    ])
    .boxed();
    let write = VolumeWrite {
        file: WriteFile {
            path: "/a b/f&x.txt".into(),
            mode: 0o600,
            tar: false,
            xattrs: [("user.k".to_string(), "v".to_string())].into(),
        },
        owner: Owner {
            uid: 1000,
            gid: 1001,
        },
        replace: true,
    };
    let entry = node.volume_write(&ds, write.clone(), body).await.unwrap();
    assert_eq!(
        (
            entry.size,
            entry.uid,
            entry.gid,
            entry.mode,
            entry.changed_ms
        ),
        (11, 1000, 1001, 0o600, Some(3))
    );
    let read = node.volume_read(&ds, "/a b/f&x.txt").await.unwrap();
    assert_eq!(read.kind, FileKind::File { size: 11 });
    assert_eq!(read_all(read.body).await, b"rows & more");
    let missing = node.volume_read(&ds, "/nope").await.err().unwrap();
    assert_eq!(missing.kind, ErrorKind::NotFound);
    let taken = VolumeWrite {
        file: WriteFile {
            path: "/exists".into(),
            ..write.file.clone()
        },
        replace: false,
        ..write
    };
    let refused = node
        .volume_write(&ds, taken, stream::empty().boxed())
        .await
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::Conflict);
    let op = PathOp::MakeDirAs {
        path: "/d/e".into(),
        owner: Owner { uid: 1, gid: 2 },
        mode: 0o750,
        parents: true,
        exist_ok: false,
    };
    assert!(node.volume_path_op(&ds, op).await.unwrap().is_empty());
    let op = PathOp::SetAttrs {
        path: "/missing".into(),
        uid: None,
        gid: Some(5),
        mode: Some(0o644),
    };
    let missing = node.volume_path_op(&ds, op).await.unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound);
    let calls = fake.calls();
    for expected in [
        r#"volume_write ds /a b/f&x.txt 600 1000:1001 true {"user.k": "v"}"#,
        r#"volume_path_op ds {"op":"make_dir_as","path":"/d/e","owner":{"uid":1,"gid":2},"mode":488,"parents":true,"exist_ok":false}"#,
        r#"volume_path_op ds {"op":"set_attrs","path":"/missing","gid":5,"mode":420}"#,
    ] {
        assert!(
            calls.iter().any(|c| c == expected),
            "{expected:?} not in {calls:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_keep_their_kind_and_message() {
    let Harness { node, .. } = start().await;

    let e = node.status("ghost", true).await.unwrap_err();
    assert_eq!(e, NodeError::not_found("no sandbox \"ghost\" on this node"));
    // An id that needs escaping in a path arrives whole.
    let e = node.status("we/ird id?ä", true).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert_eq!(e.message, "no sandbox \"we/ird id?ä\" on this node");

    let e = node.create(create_req("sb-1")).await.unwrap_err();
    assert_eq!(e, NodeError::conflict("sandbox sb-1 exists"));
    let e = node.create(create_req("full")).await.unwrap_err();
    assert_eq!(
        e,
        NodeError::new(ErrorKind::NoRoom, "no slot left: 32 of 32 in use")
    );
    let bad = NetworkSpec {
        mode: NetworkMode::Allowlist,
        allow: vec!["bad".into()],
        deny: vec![],
    };
    let e = node.check_network(bad).await.unwrap_err();
    assert_eq!(
        e,
        NodeError::invalid("rule \"bad\" has no port: write HOST:PORT")
    );
    let e = node.image_push("denied/x:1", None).await.unwrap_err();
    assert_eq!(
        e,
        NodeError::new(ErrorKind::Upstream, "registry refused the push: 403")
    );
    let e = node.image_remove("busy:1").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Conflict);
    let e = node.image_for_create("missing:1").await.unwrap_err();
    assert_eq!(e, NodeError::not_found("no image missing:1"));

    // Errors of the streaming calls, before and inside the stream.
    assert_eq!(
        node.exec("ghost", ExecRequest::default())
            .await
            .err()
            .unwrap()
            .kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        node.logs("ghost", true).await.err().unwrap().kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        node.read_file("sb-1", "/nope").await.err().unwrap(),
        NodeError::not_found("no file /nope in sandbox sb-1")
    );
    let e = node.connect_port("sb-1", 8).await.err().unwrap();
    assert_eq!(
        e,
        NodeError::conflict("nothing listens on port 8 in sandbox sb-1")
    );
    let updates: Vec<PullUpdate> = node.image_pull("broken:1").await.unwrap().collect().await;
    assert_eq!(
        updates.last(),
        Some(&PullUpdate::Error {
            error: NodeError::new(ErrorKind::Upstream, "registry answered 500")
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_resume_from_since() {
    let Harness { fake, node, .. } = start().await;
    let event = |n: u64| NodeEvent::Expired {
        id: format!("sb-{n}"),
        reason: "ttl".into(),
    };
    // Sequence numbers with gaps: `since` is a seq, not a count.
    for n in 1..=5 {
        fake.push(n * 10, event(n));
    }

    let mut feed = node.events(0).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(next_within(&mut feed).await.unwrap());
    }
    assert_eq!(seen.iter().map(|s| s.seq).collect::<Vec<_>>(), [10, 20, 30]);
    drop(feed);

    let mut feed = node.events(seen[2].seq).await.unwrap();
    let fourth = next_within(&mut feed).await.unwrap();
    let fifth = next_within(&mut feed).await.unwrap();
    assert_eq!((fourth.seq, fourth.event), (40, event(4)));
    assert_eq!((fifth.seq, fifth.event), (50, event(5)));

    // Nothing more yet: the stream waits rather than ends.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), feed.next())
            .await
            .is_err()
    );
    let pusher = fake.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        pusher.push(60, NodeEvent::CpuSaturated { busy: 0.9 });
    });
    let sixth = next_within(&mut feed).await.unwrap();
    assert_eq!(sixth.seq, 60);
    assert_eq!(sixth.event, NodeEvent::CpuSaturated { busy: 0.9 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_end_when_the_connection_drops() {
    let Harness { fake, addr, .. } = start().await;
    let relay = Relay::to(addr).await;
    let node = HttpNode::new(&format!("http://{}", relay.addr), CREDENTIAL).unwrap();
    fake.push(1, NodeEvent::CpuSaturated { busy: 0.95 });
    let mut feed = node.events(0).await.unwrap();
    assert_eq!(next_within(&mut feed).await.unwrap().seq, 1);
    relay.cut();
    assert_eq!(next_within(&mut feed).await, None);
}

/// 1 MiB of reproducible noise, chunk `i` of a file.
fn noise(i: u64) -> Bytes {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (i + 1);
    let mut out = Vec::with_capacity(MIB);
    while out.len() < MIB {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    Bytes::from(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_file_streams_both_ways() {
    const CHUNKS: u64 = 64;
    let Harness { fake, node, .. } = start().await;

    let mut expected = Sha256::new();
    for i in 0..CHUNKS {
        expected.update(noise(i));
    }
    let expected = expected.finalize();

    // Generated as it is sent: no buffer holds the whole file here.
    let body: ByteStream = stream::iter(0..CHUNKS).map(|i| Ok(noise(i))).boxed();
    let write = WriteFile {
        path: "/data/big.bin".into(),
        mode: 0o600,
        tar: false,
        xattrs: Default::default(),
    };
    node.write_file("sb-1", write, body).await.unwrap();
    {
        let upload = fake.last_upload.lock().unwrap();
        assert_eq!(upload.bytes, CHUNKS * MIB as u64);
        // The node saw it arrive in pieces, not as one buffered body.
        assert!(upload.chunks >= CHUNKS as usize, "{} chunks", upload.chunks);
        assert!(upload.largest_chunk <= MIB, "{}", upload.largest_chunk);
    }

    let read = node.read_file("sb-1", "/data/big.bin").await.unwrap();
    assert_eq!(
        read.kind,
        FileKind::File {
            size: CHUNKS * MIB as u64
        }
    );
    let mut body = read.body;
    let (mut got, mut size, mut chunks) = (Sha256::new(), 0u64, 0usize);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        size += chunk.len() as u64;
        chunks += 1;
        got.update(&chunk);
    }
    assert_eq!(size, CHUNKS * MIB as u64);
    assert!(chunks >= CHUNKS as usize, "{chunks} chunks");
    assert_eq!(got.finalize(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_or_broken_upload_keeps_its_error() {
    let Harness { fake, node, .. } = start().await;

    // Refused before the node reads the body: the 8 MiB still being sent
    // must not hide the node's answer.
    let body: ByteStream = stream::iter(0..8).map(|i| Ok(noise(i))).boxed();
    let write = WriteFile {
        path: "/x".into(),
        mode: 0o644,
        tar: false,
        xattrs: Default::default(),
    };
    let e = node.write_file("ghost", write, body).await.unwrap_err();
    assert_eq!(e, NodeError::not_found("no sandbox \"ghost\" on this node"));

    // The caller's stream fails half-way: its error comes back, and the
    // node stores nothing.
    let body: ByteStream = stream::iter(0..4)
        .map(|i| {
            if i == 2 {
                Err(NodeError::internal("the source file vanished"))
            } else {
                Ok(noise(i))
            }
        })
        .boxed();
    let write = WriteFile {
        path: "/half".into(),
        mode: 0o644,
        tar: false,
        xattrs: Default::default(),
    };
    let e = node.write_file("sb-1", write, body).await.unwrap_err();
    assert_eq!(e, NodeError::internal("the source file vanished"));
    assert!(fake
        .files
        .lock()
        .unwrap()
        .get(&("sb-1".to_string(), "/half".to_string()))
        .is_none());

    // The connection pool survived both.
    node.info().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_streams_many_events() {
    const LINES: usize = 20_000;
    let Harness { node, .. } = start().await;
    let req = ExecRequest {
        cmd: vec!["many".into(), LINES.to_string()],
        ..Default::default()
    };
    let mut events = node.exec("sb-1", req).await.unwrap();
    let mut outputs = 0;
    let mut last = None;
    while let Some(e) = next_within(&mut events).await {
        if let Some(bytes) = e.output_bytes() {
            assert_eq!(bytes, format!("line {outputs}\n").as_bytes());
            outputs += 1;
        }
        last = Some(e);
    }
    assert_eq!(outputs, LINES);
    assert!(matches!(last, Some(ExecEvent::Exit { code: 0, .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_exec_stream_reaches_the_node() {
    let Harness { fake, node, .. } = start().await;
    let req = ExecRequest {
        cmd: vec!["hang".into()],
        ..Default::default()
    };
    let mut events = node.exec("sb-1", req).await.unwrap();
    assert!(matches!(
        next_within(&mut events).await,
        Some(ExecEvent::Start { .. })
    ));
    assert!(matches!(
        next_within(&mut events).await,
        Some(ExecEvent::Keepalive)
    ));
    assert!(!fake.exec_killed.load(Ordering::SeqCst));
    drop(events);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !fake.exec_killed.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the node's exec stream lives on");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_carries_bytes_both_ways() {
    let Harness { node, .. } = start().await;
    let tunnel = node.connect_port("sb-1", ECHO_PORT).await.unwrap();
    let (mut r, mut w) = tokio::io::split(tunnel);

    // More than any socket buffer: reading and writing must overlap.
    let sent: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
    let to_send = sent.clone();
    let writer = tokio::spawn(async move {
        for piece in to_send.chunks(64 * 1024) {
            w.write_all(piece).await.unwrap();
        }
        w.flush().await.unwrap();
        w
    });
    let mut back = vec![0u8; sent.len()];
    tokio::time::timeout(Duration::from_secs(20), r.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert!(back == sent, "the echo differs");

    // Closing our side closes the echo's, and the tunnel ends.
    let mut w = writer.await.unwrap();
    w.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), r.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());

    // Several tunnels at once, each its own connection.
    let mut a = node.connect_port("sb-1", ECHO_PORT).await.unwrap();
    let mut b = node.connect_port("sb-1", ECHO_PORT).await.unwrap();
    a.write_all(b"aaa").await.unwrap();
    b.write_all(b"bbb").await.unwrap();
    let (mut ra, mut rb) = ([0u8; 3], [0u8; 3]);
    b.read_exact(&mut rb).await.unwrap();
    a.read_exact(&mut ra).await.unwrap();
    assert_eq!((&ra, &rb), (b"aaa", b"bbb"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_the_node_credential_are_refused() {
    let Harness { addr, .. } = start().await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{addr}/node/v2/info");

    let check = |resp: reqwest::Response| async move {
        assert_eq!(resp.status(), reqwest::StatusCode::UNAUTHORIZED);
        let e: NodeError = resp.json().await.unwrap();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.message.contains("node credential"), "{}", e.message);
        assert!(e.message.contains("API token"), "{}", e.message);
    };
    check(http.post(&url).send().await.unwrap()).await;
    check(
        http.post(&url)
            .bearer_auth("wrn_user_api_token")
            .send()
            .await
            .unwrap(),
    )
    .await;
    // A prefix of the credential is not the credential.
    check(
        http.post(&url)
            .bearer_auth(&CREDENTIAL[..CREDENTIAL.len() - 1])
            .send()
            .await
            .unwrap(),
    )
    .await;
    check(
        http.post(&url)
            .basic_auth("node", Some(CREDENTIAL))
            .send()
            .await
            .unwrap(),
    )
    .await;
    // Unknown routes are refused too, before saying they do not exist.
    check(
        http.get(format!("http://{addr}/node/v2/secret"))
            .send()
            .await
            .unwrap(),
    )
    .await;

    // Through the client: the same error, with its kind.
    let wrong = HttpNode::new(&format!("http://{addr}"), "wrn_user_api_token").unwrap();
    let e = wrong.info().await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(
        e.message.contains("not a user's API token"),
        "{}",
        e.message
    );
    let e = wrong
        .exec("sb-1", ExecRequest::default())
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::Invalid);
    let e = wrong.connect_port("sb-1", ECHO_PORT).await.err().unwrap();
    assert_eq!(e.kind, ErrorKind::Invalid);

    // The right one, sent by hand.
    let resp = http
        .post(&url)
        .bearer_auth(CREDENTIAL)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_node_errors() {
    let Harness { addr, .. } = start().await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let base = format!("http://{addr}/node/v2");
    let expect = |resp: reqwest::Response, status: u16, kind: ErrorKind| async move {
        assert_eq!(resp.status().as_u16(), status);
        let e: NodeError = resp.json().await.unwrap();
        assert_eq!(e.kind, kind, "{}", e.message);
        e.message
    };

    let resp = http
        .post(format!("{base}/create"))
        .bearer_auth(CREDENTIAL)
        .body("{not json")
        .send()
        .await
        .unwrap();
    expect(resp, 400, ErrorKind::Invalid).await;

    let resp = http
        .post(format!("{base}/exec"))
        .bearer_auth(CREDENTIAL)
        .body(r#"{"id":"sb-1","req":{"cmd":["true"],"surprise":1}}"#)
        .send()
        .await
        .unwrap();
    expect(resp, 400, ErrorKind::Invalid).await;

    let resp = http
        .post(format!("{base}/events"))
        .bearer_auth(CREDENTIAL)
        .body(r#"{"since":"minus-one"}"#)
        .send()
        .await
        .unwrap();
    expect(resp, 400, ErrorKind::Invalid).await;

    let resp = http
        .post(format!("{base}/nowhere"))
        .bearer_auth(CREDENTIAL)
        .send()
        .await
        .unwrap();
    expect(resp, 404, ErrorKind::NotFound).await;

    let resp = http
        .delete(format!("{base}/info"))
        .bearer_auth(CREDENTIAL)
        .send()
        .await
        .unwrap();
    expect(resp, 400, ErrorKind::Invalid).await;

    // A port tunnel is an upgrade, to a real port.
    let resp = http
        .post(
            reqwest::Url::parse_with_params(
                &format!("{base}/connect_port"),
                [("args", format!(r#"{{"id":"sb-1","port":{ECHO_PORT}}}"#))],
            )
            .unwrap(),
        )
        .bearer_auth(CREDENTIAL)
        .send()
        .await
        .unwrap();
    let m = expect(resp, 400, ErrorKind::Invalid).await;
    assert!(m.contains("Upgrade: tcp"), "{m}");
    let resp = http
        .post(
            reqwest::Url::parse_with_params(
                &format!("{base}/connect_port"),
                [("args", r#"{"id":"sb-1","port":0}"#)],
            )
            .unwrap(),
        )
        .bearer_auth(CREDENTIAL)
        .header("connection", "upgrade")
        .header("upgrade", "tcp")
        .send()
        .await
        .unwrap();
    expect(resp, 400, ErrorKind::Invalid).await;

    // JSON bodies are bounded.
    let resp = http
        .post(format!("{base}/create"))
        .bearer_auth(CREDENTIAL)
        .body(vec![b' '; 33 << 20])
        .send()
        .await
        .unwrap();
    expect(resp, 400, ErrorKind::Invalid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_is_down_is_unavailable_quickly() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let url = format!("http://{addr}");
    let node = HttpNode::new(&url, CREDENTIAL).unwrap();

    let started = Instant::now();
    let e = node.info().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert!(e.message.contains(&url), "{}", e.message);

    for e in [
        node.events(0).await.err().unwrap(),
        node.exec("sb-1", ExecRequest::default())
            .await
            .err()
            .unwrap(),
        node.connect_port("sb-1", ECHO_PORT).await.err().unwrap(),
        node.write_file(
            "sb-1",
            WriteFile {
                path: "/x".into(),
                mode: 0o644,
                tar: false,
                xattrs: Default::default(),
            },
            stream::iter(vec![Ok(Bytes::from_static(b"x"))]).boxed(),
        )
        .await
        .unwrap_err(),
    ] {
        assert_eq!(e.kind, ErrorKind::Unavailable, "{}", e.message);
    }
}

#[test]
fn http_node_takes_only_usable_urls_and_credentials() {
    for bad in [
        "not a url",
        "ftp://node:1",
        "https://node:9443",
        "unix:/run/node.sock",
    ] {
        let e = HttpNode::new(bad, CREDENTIAL).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid, "{bad}: {}", e.message);
    }
    assert_eq!(
        HttpNode::new("http://node:9000", "").unwrap_err().kind,
        ErrorKind::Invalid
    );
    assert_eq!(
        HttpNode::new("http://node:9000", "line\nbreak")
            .unwrap_err()
            .kind,
        ErrorKind::Invalid
    );
    let node = HttpNode::new("http://node:9000/", CREDENTIAL).unwrap();
    assert_eq!(node.url(), "http://node:9000");
    // The credential is never shown.
    assert!(!format!("{node:?}").contains(CREDENTIAL));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_prefix_in_the_node_url_is_kept() {
    // A node mounted under a path (as behind a reverse proxy).
    let fake = Arc::new(FakeNode::new(echo_server().await));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().nest(
        "/nodes/n1",
        router(fake, CREDENTIAL.to_string(), Fence::default()),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let node = HttpNode::new(&format!("http://{addr}/nodes/n1/"), CREDENTIAL).unwrap();
    assert_eq!(node.info().await.unwrap().name, "fake-1");
    let mut tunnel = node.connect_port("sb-1", ECHO_PORT).await.unwrap();
    tunnel.write_all(b"x").await.unwrap();
    let mut back = [0u8; 1];
    tunnel.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"x");
}

/// A fake node behind `fence`, its URL, and clients of two leaders: epoch 1
/// and epoch 2.
async fn two_leaders(fence: Fence) -> (Arc<FakeNode>, String, HttpNode, HttpNode) {
    let fake = Arc::new(FakeNode::new(echo_server().await));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(fake.clone(), CREDENTIAL.to_string(), fence);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let url = format!("http://{addr}");
    let leader = |epoch| {
        HttpNode::new(&url, CREDENTIAL)
            .unwrap()
            .with_leader_epoch(epoch)
    };
    let (old, new) = (leader(1), leader(2));
    (fake, url, old, new)
}

/// Two replicas of a control plane: once the node has seen the newer
/// leader's epoch, the older leader's calls are refused (reads and
/// destroys alike, with the `fenced` kind), the newer one's go on, and so
/// do calls without an epoch (a node driven by a `warren up` in-process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_leader_is_fenced_off() {
    let dir = tempfile::tempdir().unwrap();
    let fence = Fence::open(dir.path().join("leader-epoch")).unwrap();
    let (_fake, url, old, new) = two_leaders(fence.clone()).await;

    old.info().await.expect("epoch 1 leads at first");
    new.info().await.expect("epoch 2 takes over");
    assert_eq!(fence.epoch(), 2);
    let e = old.info().await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Fenced, "{e}");
    assert!(e.message.contains("epoch 2"), "{}", e.message);
    let e = old.destroy("sb-1", "stale").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Fenced);
    new.info().await.expect("the new leader goes on");
    HttpNode::new(&url, CREDENTIAL)
        .unwrap()
        .info()
        .await
        .expect("no epoch: not fenced");
    // The node remembers across a restart.
    assert_eq!(
        Fence::open(dir.path().join("leader-epoch"))
            .unwrap()
            .epoch(),
        2
    );
}

/// A create that is under way when its leader is replaced: whatever it
/// made is destroyed and the old leader told `fenced` (the new leader took
/// stock of the node before the sandbox existed). A create whose caller
/// goes away still runs to its end, so nothing is left half made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_outlives_its_leader_is_undone() {
    let (fake, _url, old, new) = two_leaders(Fence::default()).await;
    let started = |id: &str| {
        let (fake, line) = (fake.clone(), format!("creating {id}"));
        async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !fake.calls().contains(&line) {
                assert!(Instant::now() < deadline, "{line:?} never reached the node");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };

    let stale = tokio::spawn({
        let old = old.clone();
        async move { old.create(create_req("slow-1")).await }
    });
    started("slow-1").await;
    new.inventory().await.expect("the new leader takes stock");
    // The caller of this one goes away mid-create.
    let vanished = tokio::spawn({
        let new = new.clone();
        async move { new.create(create_req("slow-2")).await }
    });
    started("slow-2").await;
    vanished.abort();
    let _ = vanished.await;
    fake.slow_gate.send_replace(true);

    let e = stale.await.unwrap().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Fenced, "{e}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let held = fake.sandboxes.lock().unwrap().clone();
        if !held.contains_key("slow-1") && held.contains_key("slow-2") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slow-1 should be undone and slow-2 made: {:?}",
            held.keys().collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        fake.calls().iter().any(|c| c.starts_with("destroy slow-1")),
        "{:?}",
        fake.calls()
    );
}

/// The node API over TLS: a client pinned to the node's certificate makes
/// calls, streams and a port tunnel (an upgrade inside TLS); a client
/// pinned to another certificate, or speaking plain HTTP, gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_pinned_certificate() {
    use warren_node_http::tls::Identity;
    let fake = Arc::new(FakeNode::new(echo_server().await));
    let dir = tempfile::tempdir().unwrap();
    let identity = Identity::load_or_create(dir.path()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(fake.clone(), CREDENTIAL.to_string(), Fence::default());
    tokio::spawn(warren_node_http::serve_tls(
        listener,
        app,
        identity.acceptor().unwrap(),
    ));
    let url = format!("https://{addr}");
    let node = HttpNode::pinned(&url, CREDENTIAL, &identity.fingerprint()).unwrap();
    node.info().await.expect("info over TLS");
    node.create(create_req("sb-t"))
        .await
        .expect("create over TLS");
    let mut tunnel = node.connect_port("sb-t", ECHO_PORT).await.unwrap();
    tunnel.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    tunnel.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
    drop(tunnel);

    // Another certificate: refused before any request is sent.
    let other = Identity::load_or_create(tempfile::tempdir().unwrap().path()).unwrap();
    let wrong = HttpNode::pinned(&url, CREDENTIAL, &other.fingerprint()).unwrap();
    let e = wrong.info().await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    // Plain HTTP to the TLS port gets no answer from the API.
    let plain = HttpNode::new(&format!("http://{addr}"), CREDENTIAL).unwrap();
    assert!(plain.info().await.is_err());
    // A pin and a plain URL, or https without one, are refused at once.
    assert_eq!(
        HttpNode::pinned(
            &format!("http://{addr}"),
            CREDENTIAL,
            &identity.fingerprint()
        )
        .unwrap_err()
        .kind,
        ErrorKind::Invalid
    );
    assert_eq!(
        HttpNode::new(&url, CREDENTIAL).unwrap_err().kind,
        ErrorKind::Invalid
    );
}

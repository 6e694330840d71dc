//! A node that does no kernel work: it keeps its sandboxes in memory, so
//! the control plane's logic (reclaim rules, reconciliation, the queue,
//! races) can be tested by an ordinary user. Tests steer it: push events,
//! make calls fail or wait, read what was asked of it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;

use crate::api::NodeApi;
use crate::calls::prelude::*;
use crate::error::{NodeError, NodeResult};
use warren_core::sync::lock;

#[derive(Default)]
struct State {
    sandboxes: BTreeMap<String, SandboxStatus>,
    /// Every call that changed something, in order (`create sbx-…`).
    calls: Vec<String>,
    /// Errors the next call of a method (by name) answers.
    fail: HashMap<String, NodeError>,
    logs: HashMap<String, Vec<LogNote>>,
}

pub struct FakeNode {
    name: String,
    allocatable: Resources,
    state: Mutex<State>,
    events: Arc<Mutex<Vec<Sequenced>>>,
    /// The newest event's sequence number.
    last: watch::Sender<u64>,
    /// How long `create` takes.
    create_delay: Mutex<Duration>,
}

impl FakeNode {
    pub fn new(name: &str, allocatable: Resources) -> Arc<FakeNode> {
        Arc::new(FakeNode {
            name: name.into(),
            allocatable,
            state: Mutex::new(State::default()),
            events: Arc::default(),
            last: watch::Sender::new(0),
            create_delay: Mutex::new(Duration::ZERO),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Reports an event, as the node would.
    pub fn push(&self, event: NodeEvent) {
        let mut events = lock(&self.events);
        let seq = events.len() as u64 + 1;
        events.push(Sequenced { seq, event });
        self.last.send_replace(seq);
    }

    /// The next call of `method` answers `error`.
    pub fn fail_next(&self, method: &str, error: NodeError) {
        self.state().fail.insert(method.into(), error);
    }

    pub fn set_create_delay(&self, d: Duration) {
        *lock(&self.create_delay) = d;
    }

    /// A sandbox the node holds as if a create (or a restart) left it.
    pub fn hold_sandbox(&self, id: &str, phase: Phase) {
        self.state().sandboxes.insert(id.into(), status(id, phase));
    }

    pub fn phase(&self, id: &str) -> Option<Phase> {
        self.state().sandboxes.get(id).map(|s| s.phase)
    }

    pub fn ids(&self) -> Vec<String> {
        self.state().sandboxes.keys().cloned().collect()
    }

    pub fn calls(&self) -> Vec<String> {
        self.state().calls.clone()
    }

    /// The notes written to a sandbox's log.
    pub fn notes(&self, id: &str) -> Vec<LogNote> {
        self.state().logs.get(id).cloned().unwrap_or_default()
    }

    fn call(&self, method: &str, id: &str) -> NodeResult<()> {
        let mut s = self.state();
        s.calls.push(format!("{method} {id}").trim().to_string());
        match s.fail.remove(method) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn log(&self, id: &str, note: LogNote) {
        self.state().logs.entry(id.into()).or_default().push(note);
    }

    fn with<T>(&self, id: &str, f: impl FnOnce(&mut SandboxStatus) -> T) -> NodeResult<T> {
        let mut s = self.state();
        let sandbox = s
            .sandboxes
            .get_mut(id)
            .ok_or_else(|| NodeError::not_found(format!("sandbox {id} is not on this node")))?;
        Ok(f(sandbox))
    }
}

fn status(id: &str, phase: Phase) -> SandboxStatus {
    SandboxStatus {
        id: id.into(),
        phase,
        image_digest: "sha256:fake".into(),
        pid: 1,
        host_id_base: None,
        ttl_remaining_ms: 3_600_000,
        lease_remaining_ms: None,
        usage: Some(Usage::default()),
        phases: Vec::new(),
    }
}

fn unsupported<T>(what: &str) -> NodeResult<T> {
    Err(NodeError::invalid(format!("the fake node has no {what}")))
}

#[async_trait::async_trait]
impl NodeApi for FakeNode {
    async fn info(&self) -> NodeResult<NodeInfo> {
        let sandboxes = self.state().sandboxes.len() as u32;
        Ok(NodeInfo {
            name: self.name.clone(),
            labels: Default::default(),
            allocatable: self.allocatable,
            max_pids: 4096,
            load: Load {
                sandboxes,
                ..Default::default()
            },
            images: Vec::new(),
            devices: Vec::new(),
        })
    }

    async fn inventory(&self) -> NodeResult<Vec<SandboxStatus>> {
        self.call("inventory", "")?;
        Ok(self.state().sandboxes.values().cloned().collect())
    }

    async fn status(&self, id: &str, _read_usage: bool) -> NodeResult<SandboxStatus> {
        self.with(id, |s| s.clone())
    }

    async fn events(&self, since: u64) -> NodeResult<BoxStream<'static, Sequenced>> {
        let (feed, rx) = (self.events.clone(), self.last.subscribe());
        let pending = std::collections::VecDeque::new();
        Ok(futures_util::stream::unfold(
            (since, rx, pending),
            move |(mut seen, mut rx, mut pending)| {
                let feed = feed.clone();
                async move {
                    loop {
                        if let Some(ev) = pending.pop_front() {
                            let ev: Sequenced = ev;
                            seen = ev.seq;
                            return Some((ev, (seen, rx, pending)));
                        }
                        rx.borrow_and_update();
                        pending.extend(lock(&feed).iter().filter(|e| e.seq > seen).cloned());
                        if pending.is_empty() && rx.changed().await.is_err() {
                            return None;
                        }
                    }
                }
            },
        )
        .boxed())
    }

    async fn create(&self, req: CreateSandbox) -> NodeResult<SandboxStatus> {
        let delay = *lock(&self.create_delay);
        tokio::time::sleep(delay).await;
        self.call("create", &req.id)?;
        let mut s = self.state();
        if s.sandboxes.contains_key(&req.id) {
            return Err(NodeError::conflict(format!("sandbox {} exists", req.id)));
        }
        let st = status(&req.id, Phase::Running);
        s.sandboxes.insert(req.id.clone(), st.clone());
        Ok(st)
    }

    async fn start_main(&self, id: &str) -> NodeResult<()> {
        self.call("start_main", id)?;
        self.with(id, |_| ())
    }

    async fn destroy(&self, id: &str, why: &str) -> NodeResult<Option<Usage>> {
        self.call("destroy", id)?;
        let (state, reason) = ("destroyed".into(), why.into());
        let message = String::new();
        self.log(
            id,
            LogNote {
                state,
                reason,
                message,
            },
        );
        Ok(self.state().sandboxes.remove(id).and_then(|st| st.usage))
    }

    async fn set_paused(&self, id: &str, paused: bool) -> NodeResult<()> {
        self.call(if paused { "pause" } else { "resume" }, id)?;
        let phase = if paused {
            Phase::Paused
        } else {
            Phase::Running
        };
        self.with(id, |s| s.phase = phase)
    }

    async fn hold(&self, id: &str, hold_for: Duration, note: LogNote) -> NodeResult<Option<Usage>> {
        self.call("hold", id)?;
        let usage = self.with(id, |s| {
            s.phase = Phase::Held;
            s.ttl_remaining_ms = hold_for.as_millis() as u64;
            s.lease_remaining_ms = None;
            s.usage.clone()
        })?;
        self.log(id, note);
        Ok(usage)
    }

    async fn set_ttl(&self, id: &str, ttl: Duration) -> NodeResult<()> {
        self.call("set_ttl", id)?;
        self.with(id, |s| s.ttl_remaining_ms = ttl.as_millis() as u64)
    }

    async fn claim(&self, id: &str, spec: SandboxSpec) -> NodeResult<SandboxStatus> {
        self.call("claim", id)?;
        self.with(id, |s| {
            s.ttl_remaining_ms = spec.ttl().as_millis() as u64;
            s.clone()
        })
    }

    async fn renew_lease(&self, _id: &str) -> NodeResult<()> {
        Ok(())
    }

    async fn note(&self, id: &str, note: LogNote) -> NodeResult<()> {
        self.log(id, note);
        Ok(())
    }

    async fn exec(&self, id: &str, _req: ExecRequest) -> NodeResult<BoxStream<'static, ExecEvent>> {
        self.call("exec", id)?;
        self.with(id, |_| ())?;
        Ok(futures_util::stream::empty().boxed())
    }

    async fn exec_input(&self, _: &str, _: &str, _: Bytes, _: bool) -> NodeResult<()> {
        unsupported("exec input")
    }

    async fn exec_resize(&self, _id: &str, _exec_id: &str, _size: WindowSize) -> NodeResult<()> {
        unsupported("terminals")
    }

    async fn write_file(&self, id: &str, _req: WriteFile, _body: ByteStream) -> NodeResult<()> {
        self.call("write_file", id)?;
        self.with(id, |_| ())
    }

    async fn read_file(&self, _id: &str, _path: &str) -> NodeResult<FileRead> {
        unsupported("files")
    }

    async fn path_op(&self, _id: &str, _op: PathOp) -> NodeResult<Vec<PathEntry>> {
        unsupported("files")
    }

    async fn watch(&self, _: &str, _: &str, _: bool) -> NodeResult<BoxStream<'static, WatchEvent>> {
        unsupported("files")
    }

    async fn logs(&self, _id: &str, _follow: bool) -> NodeResult<ByteStream> {
        unsupported("log files")
    }

    async fn connect_port(&self, _id: &str, _port: u16) -> NodeResult<Box<dyn Tunnel>> {
        unsupported("ports")
    }

    async fn check_network(&self, _network: NetworkSpec) -> NodeResult<()> {
        Ok(())
    }

    async fn set_network(&self, id: &str, _network: NetworkSpec) -> NodeResult<PolicyChange> {
        self.call("set_network", id)?;
        self.with(id, |_| PolicyChange::default())
    }

    async fn commit(&self, _id: &str, _req: CommitImage) -> NodeResult<ImageInfo> {
        unsupported("image store")
    }

    async fn fork_layer(&self, id: &str) -> NodeResult<ForkLayer> {
        self.call("fork_layer", id)?;
        self.with(id, |_| ())?;
        let n = self.state().calls.len();
        Ok(ForkLayer {
            layers: vec![format!("fk-fake{n:08}")],
            bytes: 0,
            entries: 0,
            frozen_ms: 0,
        })
    }

    async fn release_fork_layer(&self, layer: &str) -> NodeResult<()> {
        self.call("release_fork_layer", layer)
    }

    async fn image_list(&self) -> NodeResult<Vec<ImageInfo>> {
        Ok(vec![])
    }

    async fn image_for_create(&self, reference: &str) -> NodeResult<ImageInfo> {
        self.call("image_for_create", reference)?;
        Ok(ImageInfo {
            name: reference.into(),
            digest: "sha256:fake".into(),
            layers: 1,
            record: serde_json::json!({"name": reference}),
        })
    }

    async fn image_pull(&self, _reference: &str) -> NodeResult<BoxStream<'static, PullUpdate>> {
        unsupported("registry")
    }

    async fn image_derive(&self, _req: DeriveImage) -> NodeResult<ImageInfo> {
        unsupported("image store")
    }

    async fn image_step(&self, _key: &str) -> NodeResult<Option<ImageInfo>> {
        unsupported("image store")
    }

    async fn image_import(&self, _name: &str, _archive: ByteStream) -> NodeResult<ImageInfo> {
        unsupported("image store")
    }

    async fn image_push(&self, _reference: &str, _source: Option<&str>) -> NodeResult<Pushed> {
        unsupported("registry")
    }

    async fn image_remove(&self, _reference: &str) -> NodeResult<ImageInfo> {
        unsupported("image store")
    }

    async fn image_gc(&self, _budget: Option<u64>) -> NodeResult<GcReport> {
        Ok(GcReport::default())
    }

    async fn volume_create(&self, _req: VolumeRequest) -> NodeResult<VolumeInfo> {
        unsupported("volumes")
    }

    async fn volume_list(&self) -> NodeResult<Vec<VolumeInfo>> {
        Ok(Vec::new())
    }

    async fn volume_remove(&self, _name: &VolumeName) -> NodeResult<VolumeInfo> {
        unsupported("volumes")
    }

    async fn volume_write(
        &self,
        _: &VolumeName,
        _: VolumeWrite,
        _: ByteStream,
    ) -> NodeResult<PathEntry> {
        unsupported("volumes")
    }

    async fn volume_read(&self, _volume: &VolumeName, _path: &str) -> NodeResult<FileRead> {
        unsupported("volumes")
    }

    async fn volume_path_op(
        &self,
        _volume: &VolumeName,
        _op: PathOp,
    ) -> NodeResult<Vec<PathEntry>> {
        unsupported("volumes")
    }
}

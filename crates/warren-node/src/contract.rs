//! The in-process transport of the node contract: [`LocalNode`] answers
//! [`NodeApi`] by calling the node directly (no serialization, no copies
//! beyond the byte streams themselves). The node's own errors become the
//! contract's categories here, and nowhere else.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use warren_core::spec::NetworkSpec;
use warren_core::{ExecEvent, ExecRequest, Usage};
use warren_node_api as api;
use warren_node_api::{
    ByteStream, CommitImage, CreateSandbox, DeriveImage, FileKind, FileRead, ForkLayer, GcReport,
    ImageInfo, ImageTarget, LogNote, NodeApi, NodeInfo, NodeResult, PathEntry, PathKind, PathOp,
    Phase, PolicyChange, PullUpdate, Pushed, SandboxStatus, Sequenced, Tunnel, VolumeWrite,
    WatchEvent, WatchKind, WriteFile,
};
use warren_runtime::{file_ops, files, RuntimeError};

use crate::{Node, NodeError};
use warren_core::sync::lock;

/// A node driven in the same process (`warren up`).
pub struct LocalNode {
    node: Arc<Node>,
}

impl LocalNode {
    pub fn new(node: Arc<Node>) -> LocalNode {
        LocalNode { node }
    }

    /// The root of a volume's file system, mounted on the host if it is
    /// not.
    async fn volume_root(
        &self,
        volume: &warren_core::volume::VolumeName,
    ) -> NodeResult<std::os::fd::OwnedFd> {
        let (node, volume) = (self.node.clone(), volume.clone());
        tokio::task::spawn_blocking(move || node.volumes.root(&volume))
            .await
            .map_err(joined)?
            .map_err(contract_error)
    }
}

/// The contract's category and message for a node error. Messages say
/// what to do; the control plane adds nothing but the HTTP status.
pub fn contract_error(e: NodeError) -> api::NodeError {
    use api::NodeError as E;
    match e {
        NodeError::NotRunning(id) => E::conflict(format!(
            "sandbox {id} is not running; exec and files need a running sandbox (see `warren inspect {id}`)"
        )),
        NodeError::BadRequest(m) => E::invalid(m),
        NodeError::Conflict(m) => E::conflict(m),
        NodeError::NotFound(m) | NodeError::Runtime(RuntimeError::NotFound(m)) => {
            E::not_found(m)
        }
        NodeError::Runtime(RuntimeError::BadPath(m)) => E::invalid(format!("invalid path {m}")),
        NodeError::Runtime(RuntimeError::Exists(m)) => E::conflict(m),
        NodeError::Runtime(RuntimeError::BadImage(m)) => E::invalid(m),
        NodeError::Runtime(RuntimeError::Unresponsive(m)) => E::unavailable(m),
        NodeError::Runtime(RuntimeError::NoRoom(m)) => E::new(api::ErrorKind::NoRoom, m),
        NodeError::Image(e) => image_error(e),
        NodeError::Net(e @ (warren_net::NetError::Rule(_) | warren_net::NetError::OpenOff)) => {
            E::invalid(e.to_string())
        }
        other => E::internal(other.to_string()),
    }
}

/// A path as the sandbox's processes see it: host owner ids mapped back
/// into its user namespace (an id outside its range shows as nobody).
fn path_entry(s: warren_runtime::file_ops::Stat, id_base: Option<u32>) -> PathEntry {
    use warren_runtime::file_ops::Kind;
    let inside = |host: u32| match id_base {
        None => host,
        Some(base) if (base..base + 65536).contains(&host) => host - base,
        Some(_) => 65534,
    };
    PathEntry {
        path: s.path,
        kind: match s.kind {
            Kind::File => PathKind::File,
            Kind::Dir => PathKind::Dir,
            Kind::Symlink => PathKind::Symlink,
            Kind::Other => PathKind::Other,
        },
        size: s.size,
        mode: s.mode,
        uid: inside(s.uid),
        gid: inside(s.gid),
        modified_ms: (s.modified_unix_ns / 1_000_000) as i64,
        accessed_ms: Some((s.accessed_unix_ns / 1_000_000) as i64),
        changed_ms: Some((s.changed_unix_ns / 1_000_000) as i64),
        symlink_target: s.symlink_target,
        xattrs: s.xattrs,
    }
}

fn image_error(e: warren_image::ImageError) -> api::NodeError {
    use api::NodeError as E;
    use warren_image::{ErrorKind, ImageError};
    match e.kind() {
        ErrorKind::NotFound if matches!(e, ImageError::RemoteNotFound(_)) => {
            E::not_found(e.to_string())
        }
        ErrorKind::NotFound => E::not_found(format!(
            "{e}; import it with `warren image import FILE.tar --name NAME:TAG` (see `warren image ls`)"
        )),
        ErrorKind::Invalid => E::invalid(e.to_string()),
        ErrorKind::Conflict => E::conflict(e.to_string()),
        ErrorKind::Internal => E::internal(e.to_string()),
        ErrorKind::Upstream => E::new(api::ErrorKind::Upstream, e.to_string()),
    }
}

/// The store name an image made on this node is recorded under; a name
/// in the step cache's repository is the step cache's alone.
fn target_name(target: &ImageTarget) -> NodeResult<String> {
    match target {
        ImageTarget::Name(name) if warren_image::is_step_name(name) => {
            Err(api::NodeError::invalid(format!(
                "{name:?} is in the build step cache's repository; choose another name"
            )))
        }
        ImageTarget::Name(name) => Ok(name.clone()),
        ImageTarget::Step(key) => warren_image::step_name(key).ok_or_else(|| {
            api::NodeError::invalid(format!("step key {key:?} is not 64 lowercase hex digits"))
        }),
    }
}

fn image_info(r: &warren_image::ImageRecord) -> ImageInfo {
    ImageInfo {
        name: r.name.clone(),
        digest: r.digest.clone(),
        layers: r.layers.len(),
        record: serde_json::to_value(r).unwrap_or_default(),
    }
}

/// Runs a path operation in `root`; ids given are as the target's
/// processes see them (0 to 65535, what a sandbox has, wherever it runs),
/// `id_base` the first host id of a sandbox's user namespace (None: the
/// ids are the host's, as in a volume or a sandbox without one).
fn run_path_op(
    root: &std::os::fd::OwnedFd,
    op: PathOp,
    id_base: Option<u32>,
) -> Result<Vec<file_ops::Stat>, RuntimeError> {
    let host = |id: u32| match id_base {
        _ if id >= 65536 => Err(RuntimeError::BadPath(format!(
            "owner {id}: a sandbox has the ids 0 to 65535"
        ))),
        None => Ok(id),
        Some(base) => base.checked_add(id).ok_or_else(|| {
            RuntimeError::Files(format!("owner {id}: beyond the host's ids from {base}"))
        }),
    };
    Ok(match op {
        PathOp::Stat { path } => vec![file_ops::stat(root, &path)?],
        PathOp::List { path, depth } => file_ops::list(root, &path, depth)?,
        PathOp::MakeDir { path } => vec![file_ops::make_dir(root, &path)?],
        PathOp::Rename { from, to } => vec![file_ops::rename(root, &from, &to)?],
        PathOp::Remove { path } => {
            file_ops::remove(root, &path)?;
            vec![]
        }
        PathOp::MakeDirAs {
            path,
            owner,
            mode,
            parents,
            exist_ok,
        } => {
            let opts = file_ops::DirOptions {
                owner: (host(owner.uid)?, host(owner.gid)?),
                mode,
                parents,
                exist_ok,
            };
            vec![file_ops::make_dir_as(root, &path, opts)?]
        }
        PathOp::SetAttrs {
            path,
            uid,
            gid,
            mode,
        } => {
            let uid = uid.map(host).transpose()?;
            let gid = gid.map(host).transpose()?;
            vec![file_ops::set_attrs(root, &path, uid, gid, mode)?]
        }
    })
}

/// A refusal about a volume's path, worded for a volume (the runtime's
/// file functions speak of sandboxes).
fn in_volume(e: RuntimeError) -> api::NodeError {
    let mut e = contract_error(e.into());
    e.message = e.message.replace("sandbox", "volume");
    e
}

/// A read's answer: a file's bytes (never more than its length when
/// opened), or a directory packed as a tar archive as it is read.
fn file_read(entry: files::Entry) -> FileRead {
    let io = |r: std::io::Result<Bytes>| r.map_err(|e| api::NodeError::internal(e.to_string()));
    match entry {
        files::Entry::File(f, size) => {
            // The sandbox may write to the file meanwhile: never send
            // more than the length announced (a file that shrinks ends
            // the stream early, which a client sees as a short body).
            use tokio::io::AsyncReadExt;
            let file = tokio::fs::File::from_std(f).take(size);
            FileRead {
                kind: FileKind::File { size },
                body: tokio_util::io::ReaderStream::new(file).map(io).boxed(),
            }
        }
        files::Entry::Dir(dir) => {
            let (reader, writer) = tokio::io::duplex(256 * 1024);
            tokio::task::spawn_blocking(move || {
                let mut w = tokio_util::io::SyncIoBridge::new(writer);
                if let Err(e) = files::pack_dir(dir, &mut w) {
                    tracing::warn!(error = %e, "packing directory");
                }
            });
            FileRead {
                kind: FileKind::Dir,
                body: tokio_util::io::ReaderStream::new(reader).map(io).boxed(),
            }
        }
    }
}

fn joined(e: tokio::task::JoinError) -> api::NodeError {
    api::NodeError::internal(format!("node task: {e}"))
}

impl Node {
    fn status_of(&self, id: &str, fresh: bool) -> Option<SandboxStatus> {
        let live = self.get(id).ok()?;
        if fresh {
            self.sample_one(id, &live, false);
        }
        let usage = lock(&live.usage).usage();
        let (ttl, lease) = {
            let l = lock(&live.lifetime);
            (
                l.ttl_remaining().as_millis() as u64,
                l.lease_remaining().map(|d| d.as_millis() as u64),
            )
        };
        Some(SandboxStatus {
            id: id.to_string(),
            phase: live.phase(),
            image_digest: live.image_digest.clone(),
            pid: live.pid,
            host_id_base: self.host_id_base(id),
            ttl_remaining_ms: ttl,
            lease_remaining_ms: lease,
            usage: Some(usage),
            phases: Vec::new(),
        })
    }
}

#[async_trait::async_trait]
impl NodeApi for LocalNode {
    async fn info(&self) -> NodeResult<NodeInfo> {
        let n = &self.node;
        let sandboxes = lock(&n.live).len() as u32;
        let images = n.images.clone();
        // A store that cannot be read reports no images (placement then
        // only loses its locality preference for this node).
        let images = tokio::task::spawn_blocking(move || images.list())
            .await
            .ok()
            .and_then(Result::ok)
            .map(|list| list.into_iter().map(|r| r.digest).collect())
            .unwrap_or_default();
        let mut labels = n.labels.clone();
        if n.egress.open_permitted() {
            labels.insert(
                warren_core::network::EGRESS_OPEN_LABEL.to_string(),
                "true".to_string(),
            );
        }
        Ok(NodeInfo {
            name: n.name.clone(),
            labels,
            allocatable: api::Resources {
                gpus: n.devices.gpus(),
                ..n.allocatable
            },
            max_pids: n.max_pids,
            load: api::Load {
                cpu_busy: n.cpu_busy(),
                disk_pressure: n.disk_pressure(),
                memory_pressure: n.memory_pressure(),
                sandboxes,
            },
            images,
            devices: n.devices.classes(),
        })
    }

    async fn inventory(&self) -> NodeResult<Vec<SandboxStatus>> {
        self.node.wait_ready().await;
        let ids: Vec<String> = lock(&self.node.live).keys().cloned().collect();
        Ok(ids
            .iter()
            .filter_map(|id| self.node.status_of(id, false))
            .collect())
    }

    async fn status(&self, id: &str, read_usage: bool) -> NodeResult<SandboxStatus> {
        self.node
            .status_of(id, read_usage)
            .ok_or_else(|| api::NodeError::not_found(format!("sandbox {id} is not on this node")))
    }

    async fn events(&self, since: u64) -> NodeResult<BoxStream<'static, Sequenced>> {
        Ok(self.node.feed.subscribe(since))
    }

    async fn create(&self, req: CreateSandbox) -> NodeResult<SandboxStatus> {
        // Never beside the sweep that follows a start.
        self.node.wait_ready().await;
        if self.node.disk_pressure() {
            return Err(api::NodeError::new(
                api::ErrorKind::NoRoom,
                "the node's disk is below its free-space floor; no sandboxes start until space is freed (see `warren ps` and docs/configuration.md)",
            ));
        }
        if self.node.memory_pressure() {
            return Err(api::NodeError::new(
                api::ErrorKind::NoRoom,
                "the host's available memory is below the node's floor; no sandboxes start until memory is freed (see docs/configuration.md, \"Requests and limits\")",
            ));
        }
        let id = req.id.clone();
        let resolving = std::time::Instant::now();
        let image = match self.node.resolve_image(&req.image_digest).await {
            Ok(image) => image,
            // In a cluster the control plane may have resolved the tag on
            // another node: this node fetches exactly that digest.
            Err(e) => match req.image_source.clone() {
                Some(pinned) => {
                    let image = self.node.pull_image(&pinned, None).await.map_err(|e| {
                        let mut e = contract_error(e);
                        e.message = format!(
                            "this node lacks the image and pulling {pinned} failed: {}",
                            e.message
                        );
                        e
                    })?;
                    self.node
                        .check_image(&image)
                        .await
                        .map_err(contract_error)?;
                    image
                }
                None => {
                    let mut e = contract_error(e);
                    e.message = format!(
                        "{} (image {:?} is local to each node: import it through the control plane, which imports it on every node, or give the server a --cluster-registry to publish local images to)",
                        e.message, req.spec.image
                    );
                    return Err(e);
                }
            },
        };
        let mut phases = vec![api::PhaseTiming::new("node_image", resolving.elapsed())];
        // In a task of its own: a caller that goes away (a control plane
        // killed mid-create) must not leave a sandbox half made.
        let node = self.node.clone();
        let (_, node_phases) = tokio::spawn(async move { node.create(req, &image).await })
            .await
            .map_err(|e| api::NodeError::internal(format!("create task: {e}")))?
            .map_err(contract_error)?;
        phases.extend(node_phases);
        let mut status = self.node.status_of(&id, false).ok_or_else(|| {
            api::NodeError::conflict(format!("sandbox {id} was destroyed as it was created"))
        })?;
        status.phases = phases;
        Ok(status)
    }

    async fn start_main(&self, id: &str) -> NodeResult<()> {
        if let Some(log) = self.node.log(id) {
            log.event("running", warren_core::state::reason::READY, "");
        }
        self.node.start_main(id).map_err(contract_error)
    }

    async fn destroy(&self, id: &str, why: &str) -> NodeResult<Option<Usage>> {
        self.node.destroy(id, why).await.map_err(contract_error)
    }

    async fn set_paused(&self, id: &str, paused: bool) -> NodeResult<()> {
        self.node
            .set_paused(id, paused)
            .await
            .map_err(contract_error)
    }

    async fn hold(&self, id: &str, hold_for: Duration, note: LogNote) -> NodeResult<Option<Usage>> {
        self.node
            .hold(id, hold_for, &note)
            .await
            .map_err(contract_error)
    }

    async fn set_ttl(&self, id: &str, ttl: Duration) -> NodeResult<()> {
        self.node.renew_lease(id);
        self.node.set_ttl(id, ttl).map_err(contract_error)
    }

    async fn claim(&self, id: &str, spec: warren_core::SandboxSpec) -> NodeResult<SandboxStatus> {
        self.node.claim(id, spec).await.map_err(contract_error)?;
        self.node.status_of(id, false).ok_or_else(|| {
            api::NodeError::not_found(format!("sandbox {id} was destroyed as it was claimed"))
        })
    }

    async fn renew_lease(&self, id: &str) -> NodeResult<()> {
        self.node.renew_lease(id);
        Ok(())
    }

    async fn note(&self, id: &str, note: LogNote) -> NodeResult<()> {
        if let Some(log) = self.node.log(id) {
            log.event(&note.state, &note.reason, &note.message);
        }
        Ok(())
    }

    async fn exec(&self, id: &str, req: ExecRequest) -> NodeResult<BoxStream<'static, ExecEvent>> {
        self.node.renew_lease(id);
        let rx = self.node.exec(id, &req).await.map_err(contract_error)?;
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx).boxed())
    }

    async fn write_file(&self, id: &str, req: WriteFile, body: ByteStream) -> NodeResult<()> {
        self.node.renew_lease(id);
        let root = self.node.root(id).map_err(contract_error)?;
        let stream = body.map(|r| r.map_err(std::io::Error::other));
        let reader = tokio_util::io::StreamReader::new(stream);
        let mut sync_reader = tokio_util::io::SyncIoBridge::new(reader);
        let written = tokio::task::spawn_blocking(move || {
            if req.tar {
                files::unpack_tar(&root, &req.path, &mut sync_reader).map(|_| ())
            } else {
                files::write_file(&root, &req.path, req.mode, &req.xattrs, &mut sync_reader)
                    .map(|_| ())
            }
        })
        .await
        .map_err(joined)?;
        // The root stays reachable through its descriptor after a destroy,
        // so a write can have failed in, or landed in, a sandbox that is gone.
        if !self.node.is_live(id) {
            return Err(api::NodeError::conflict(format!(
                "sandbox {id} was destroyed while the upload ran; nothing was kept"
            )));
        }
        if written.is_ok() {
            let (node, id) = (self.node.clone(), id.to_string());
            let _ = tokio::task::spawn_blocking(move || node.written_into(&id)).await;
        }
        written.map_err(|e| contract_error(e.into()))
    }

    async fn read_file(&self, id: &str, path: &str) -> NodeResult<FileRead> {
        self.node.renew_lease(id);
        let root = self.node.root(id).map_err(contract_error)?;
        let path = path.to_string();
        let entry = tokio::task::spawn_blocking(move || files::open_read(&root, &path))
            .await
            .map_err(joined)?
            .map_err(|e| contract_error(e.into()))?;
        Ok(file_read(entry))
    }

    async fn exec_input(
        &self,
        id: &str,
        exec_id: &str,
        data: Bytes,
        close: bool,
    ) -> NodeResult<()> {
        self.node
            .exec_input(id, exec_id, data, close)
            .await
            .map_err(contract_error)
    }

    async fn exec_resize(
        &self,
        id: &str,
        exec_id: &str,
        size: warren_core::WindowSize,
    ) -> NodeResult<()> {
        self.node
            .exec_resize(id, exec_id, size)
            .await
            .map_err(contract_error)
    }

    async fn path_op(&self, id: &str, op: PathOp) -> NodeResult<Vec<PathEntry>> {
        self.node.renew_lease(id);
        let root = self.node.root(id).map_err(contract_error)?;
        let base = self.node.host_id_base(id);
        let stats = tokio::task::spawn_blocking(move || run_path_op(&root, op, base))
            .await
            .map_err(joined)?
            .map_err(|e| contract_error(e.into()))?;
        Ok(stats.into_iter().map(|s| path_entry(s, base)).collect())
    }

    async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> NodeResult<BoxStream<'static, WatchEvent>> {
        use warren_runtime::watch::{Change, Watch};
        self.node.renew_lease(id);
        let root = self.node.root(id).map_err(contract_error)?;
        let path = path.to_string();
        let mut watch = tokio::task::spawn_blocking(move || Watch::new(root, &path, recursive))
            .await
            .map_err(joined)?
            .map_err(|e| contract_error(e.into()))?;
        let (tx, rx) = tokio::sync::mpsc::channel::<WatchEvent>(256);
        let (node, id) = (Arc::downgrade(&self.node), id.to_string());
        // One thread per watch: it reads the (non-blocking) inotify
        // descriptor every 100 ms and ends when the receiver is dropped,
        // the directory goes, or the sandbox is no longer on the node.
        let spawned = std::thread::Builder::new()
            .name("warren-watch".into())
            .spawn(move || loop {
                if tx.is_closed() {
                    return;
                }
                let alive = node.upgrade().is_some_and(|n| n.get(&id).is_ok());
                if !alive {
                    return;
                }
                match watch.read() {
                    Ok(changes) => {
                        for (name, change) in changes {
                            let kind = match change {
                                Change::Create => WatchKind::Create,
                                Change::Write => WatchKind::Write,
                                Change::Remove => WatchKind::Remove,
                                Change::Rename => WatchKind::Rename,
                                Change::Chmod => WatchKind::Chmod,
                            };
                            if tx.blocking_send(WatchEvent::Event { name, kind }).is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let error = contract_error(e.into());
                        let _ = tx.blocking_send(WatchEvent::Error { error });
                        return;
                    }
                }
                if watch.is_over() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            });
        if let Err(e) = spawned {
            return Err(api::NodeError::internal(format!("watch thread: {e}")));
        }
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx).boxed())
    }

    async fn logs(&self, id: &str, follow: bool) -> NodeResult<ByteStream> {
        if !self.node.has_log(id) {
            return Err(api::NodeError::not_found(format!(
                "no log for sandbox {id} (logs are kept for the node's --log-retention)"
            )));
        }
        let over = follow.then(|| {
            let (node, id) = (Arc::downgrade(&self.node), id.to_string());
            // Over once the sandbox is gone, or held after it finished.
            Box::new(move || {
                let over = node
                    .upgrade()
                    .and_then(|n| n.get(&id).ok())
                    .is_none_or(|l| l.phase() == Phase::Held);
                Box::pin(async move { over }) as futures_util::future::BoxFuture<'static, bool>
            })
                as Box<dyn FnMut() -> futures_util::future::BoxFuture<'static, bool> + Send>
        });
        Ok(self
            .node
            .log_stream(id, over)
            .map(|r| r.map_err(|e| api::NodeError::internal(format!("reading the log: {e}"))))
            .boxed())
    }

    async fn connect_port(&self, id: &str, port: u16) -> NodeResult<Box<dyn Tunnel>> {
        self.node.renew_lease(id);
        let stream = self
            .node
            .connect_port(id, port)
            .await
            .map_err(contract_error)?;
        Ok(Box::new(stream))
    }

    async fn check_network(&self, network: NetworkSpec) -> NodeResult<()> {
        self.node.check_network(&network).map_err(contract_error)
    }

    async fn set_network(&self, id: &str, network: NetworkSpec) -> NodeResult<PolicyChange> {
        let change = self
            .node
            .update_network(id, &network)
            .await
            .map_err(contract_error)?;
        Ok(PolicyChange {
            closed: change.closed,
            unlistened: change.unlistened,
        })
    }

    async fn commit(&self, id: &str, req: CommitImage) -> NodeResult<ImageInfo> {
        self.node.renew_lease(id);
        let name = target_name(&req.into)?;
        self.node
            .commit(id, &name, req.created_by)
            .await
            .map(|r| image_info(&r))
            .map_err(contract_error)
    }

    async fn fork_layer(&self, id: &str) -> NodeResult<ForkLayer> {
        self.node.renew_lease(id);
        self.node.fork_layer(id).await.map_err(contract_error)
    }

    async fn release_fork_layer(&self, layer: &str) -> NodeResult<()> {
        self.node.release_fork_layer(layer).await;
        Ok(())
    }

    async fn image_list(&self) -> NodeResult<Vec<ImageInfo>> {
        let images = self.node.images.clone();
        let list = tokio::task::spawn_blocking(move || images.list())
            .await
            .map_err(joined)?
            .map_err(image_error)?;
        Ok(list.iter().map(image_info).collect())
    }

    async fn image_for_create(&self, reference: &str) -> NodeResult<ImageInfo> {
        let image = self
            .node
            .image_for_create(reference)
            .await
            .map_err(contract_error)?;
        self.node
            .check_image(&image)
            .await
            .map_err(contract_error)?;
        Ok(image_info(&image))
    }

    async fn image_pull(&self, reference: &str) -> NodeResult<BoxStream<'static, PullUpdate>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<PullUpdate>();
        let events = tx.clone();
        let progress: warren_image::Progress = Arc::new(move |e| {
            if let Ok(event) = serde_json::to_value(&e) {
                let _ = events.send(PullUpdate::Progress { event });
            }
        });
        // The pull runs to its end even if the stream is dropped, so the
        // store never keeps a half-finished pull's pins or files.
        let (node, reference) = (self.node.clone(), reference.to_string());
        tokio::spawn(async move {
            let last = match node.pull_image(&reference, Some(progress)).await {
                Ok(image) => PullUpdate::Image {
                    image: image_info(&image),
                },
                Err(e) => PullUpdate::Error {
                    error: contract_error(e),
                },
            };
            let _ = tx.send(last);
        });
        Ok(tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed())
    }

    async fn image_import(&self, name: &str, mut archive: ByteStream) -> NodeResult<ImageInfo> {
        let tmp_dir = self.node.home.join("tmp");
        let internal = |e: std::io::Error| api::NodeError::internal(e.to_string());
        tokio::fs::create_dir_all(&tmp_dir)
            .await
            .map_err(internal)?;
        // Removed when dropped, whatever happens below.
        let tmp = tempfile::Builder::new()
            .prefix("upload-")
            .suffix(".tar")
            .tempfile_in(&tmp_dir)
            .map_err(internal)?;
        let result = async {
            use tokio::io::AsyncWriteExt;
            let mut file = tokio::fs::File::from_std(tmp.reopen().map_err(internal)?);
            while let Some(chunk) = archive.next().await {
                let chunk = chunk
                    .map_err(|e| api::NodeError::invalid(format!("upload interrupted: {e}")))?;
                file.write_all(&chunk).await.map_err(internal)?;
            }
            file.flush().await.map_err(internal)?;
            let images = self.node.images.clone();
            let (path, name) = (tmp.path().to_path_buf(), name.to_string());
            tokio::task::spawn_blocking(move || images.import_archive(&path, &name))
                .await
                .map_err(joined)?
                .map_err(image_error)
        }
        .await;
        Ok(image_info(&result?))
    }

    async fn image_derive(&self, req: DeriveImage) -> NodeResult<ImageInfo> {
        let name = target_name(&req.into)?;
        self.node
            .derive_image(&req.base, &name, req.settings, req.created_by)
            .await
            .map(|r| image_info(&r))
            .map_err(contract_error)
    }

    async fn image_step(&self, key: &str) -> NodeResult<Option<ImageInfo>> {
        let name = target_name(&ImageTarget::Step(key.to_string()))?;
        let images = self.node.images.clone();
        let found = tokio::task::spawn_blocking(move || images.resolve(&name))
            .await
            .map_err(joined)?;
        match found {
            Ok(record) => Ok(Some(image_info(&record))),
            Err(e) if e.kind() == warren_image::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(image_error(e)),
        }
    }

    async fn image_push(&self, reference: &str, source: Option<&str>) -> NodeResult<Pushed> {
        let (image, pushed) = self
            .node
            .push_image(reference, source)
            .await
            .map_err(contract_error)?;
        Ok(Pushed {
            image: image_info(&image),
            uploaded: pushed.uploaded,
            mounted: pushed.mounted,
        })
    }

    async fn image_remove(&self, reference: &str) -> NodeResult<ImageInfo> {
        let image = self
            .node
            .resolve_image(reference)
            .await
            .map_err(contract_error)?;
        if self.node.images_in_use().contains(&image.digest) {
            return Err(api::NodeError::conflict(format!(
                "image {reference} is used by a live sandbox; remove those sandboxes first (`warren ps`)"
            )));
        }
        let images = self.node.images.clone();
        let reference = reference.to_string();
        let removed = tokio::task::spawn_blocking(move || images.remove(&reference))
            .await
            .map_err(joined)?
            .map_err(image_error)?;
        Ok(image_info(&removed))
    }

    async fn volume_create(
        &self,
        req: warren_core::volume::VolumeRequest,
    ) -> NodeResult<warren_core::volume::VolumeInfo> {
        let node = self.node.clone();
        tokio::task::spawn_blocking(move || node.volumes.create(&req))
            .await
            .map_err(joined)?
            .map_err(contract_error)
    }

    async fn volume_list(&self) -> NodeResult<Vec<warren_core::volume::VolumeInfo>> {
        let node = self.node.clone();
        tokio::task::spawn_blocking(move || node.volumes.list())
            .await
            .map_err(joined)?
            .map_err(contract_error)
    }

    async fn volume_remove(
        &self,
        name: &warren_core::volume::VolumeName,
    ) -> NodeResult<warren_core::volume::VolumeInfo> {
        let node = self.node.clone();
        let name = name.clone();
        tokio::task::spawn_blocking(move || node.volumes.remove(&name))
            .await
            .map_err(joined)?
            .map_err(contract_error)
    }

    async fn volume_write(
        &self,
        volume: &warren_core::volume::VolumeName,
        req: VolumeWrite,
        body: ByteStream,
    ) -> NodeResult<PathEntry> {
        if req.file.tar {
            return Err(api::NodeError::invalid(
                "a volume takes files one by one, not tar archives",
            ));
        }
        let root = self.volume_root(volume).await?;
        let stream = body.map(|r| r.map_err(std::io::Error::other));
        let reader = tokio_util::io::StreamReader::new(stream);
        let mut sync_reader = tokio_util::io::SyncIoBridge::new(reader);
        let stat = tokio::task::spawn_blocking(move || -> Result<file_ops::Stat, RuntimeError> {
            let path = &req.file.path;
            // A directory in the way is a conflict here (a sandbox's write
            // calls it a bad path).
            if let Ok(st) = file_ops::stat(&root, path) {
                if st.kind == file_ops::Kind::Dir {
                    return Err(RuntimeError::Exists(format!("{path}: is a directory")));
                }
            }
            let opts = files::WriteOptions {
                parents: false,
                replace: req.replace,
                owner: Some((req.owner.uid, req.owner.gid)),
            };
            files::write_file_with(
                &root,
                path,
                req.file.mode,
                &req.file.xattrs,
                opts,
                &mut sync_reader,
            )?;
            file_ops::stat(&root, path)
        })
        .await
        .map_err(joined)?
        .map_err(in_volume)?;
        Ok(path_entry(stat, None))
    }

    async fn volume_read(
        &self,
        volume: &warren_core::volume::VolumeName,
        path: &str,
    ) -> NodeResult<FileRead> {
        let root = self.volume_root(volume).await?;
        let path = path.to_string();
        let entry = tokio::task::spawn_blocking(move || files::open_read(&root, &path))
            .await
            .map_err(joined)?
            .map_err(in_volume)?;
        Ok(file_read(entry))
    }

    async fn volume_path_op(
        &self,
        volume: &warren_core::volume::VolumeName,
        op: PathOp,
    ) -> NodeResult<Vec<PathEntry>> {
        let root = self.volume_root(volume).await?;
        let stats = tokio::task::spawn_blocking(move || run_path_op(&root, op, None))
            .await
            .map_err(joined)?
            .map_err(in_volume)?;
        Ok(stats.into_iter().map(|s| path_entry(s, None)).collect())
    }

    async fn image_gc(&self, budget: Option<u64>) -> NodeResult<GcReport> {
        let r = self
            .node
            .prune_images(budget)
            .await
            .map_err(contract_error)?;
        Ok(GcReport {
            removed: r.removed,
            used_before: r.used_before,
            used_after: r.used_after,
        })
    }
}

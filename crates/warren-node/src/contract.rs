//! The in-process transport of the node contract: [`LocalNode`] answers
//! [`NodeApi`] by calling the node directly (no serialization, no copies
//! beyond the byte streams themselves). It only maps calls to the node's
//! methods and the node's values and errors to the contract's: the node's
//! own errors become the contract's categories here, and nowhere else.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use warren_core::spec::NetworkSpec;
use warren_core::volume::{VolumeInfo, VolumeName, VolumeRequest};
use warren_core::{ExecEvent, ExecRequest, SandboxSpec, Usage, WindowSize};
use warren_node_api as api;
use warren_node_api::{
    ByteStream, CommitImage, CreateSandbox, DeriveImage, FileRead, ForkLayer, GcReport, ImageInfo,
    LogNote, NodeApi, NodeInfo, NodeResult, PathEntry, PathOp, PolicyChange, PullUpdate, Pushed,
    SandboxStatus, Sequenced, Tunnel, VolumeWrite, WatchEvent, WriteFile,
};
use warren_runtime::RuntimeError;

use crate::file_access::InVolume;
use crate::image_calls::{target_name, NoImage, PullStep};
use crate::{Node, NodeError};

/// A node driven in the same process (`warren up`).
pub struct LocalNode {
    node: Arc<Node>,
}

impl LocalNode {
    pub fn new(node: Arc<Node>) -> LocalNode {
        LocalNode { node }
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

fn image_info(r: &warren_image::ImageRecord) -> ImageInfo {
    ImageInfo {
        name: r.name.clone(),
        digest: r.digest.clone(),
        layers: r.layers.len(),
        record: serde_json::to_value(r).unwrap_or_default(),
    }
}

/// A volume call's answer: finding the volume fails as the node says,
/// the file work worded for a volume (the runtime's file functions speak
/// of sandboxes).
fn in_volume<T>(answer: InVolume<T>) -> NodeResult<T> {
    answer.map_err(contract_error)?.map_err(|e: RuntimeError| {
        let mut e = contract_error(e.into());
        e.message = e.message.replace("sandbox", "volume");
        e
    })
}

/// Answers a node call in the contract's terms.
fn answer<T>(r: Result<T, NodeError>) -> NodeResult<T> {
    r.map_err(contract_error)
}

#[async_trait::async_trait]
impl NodeApi for LocalNode {
    async fn info(&self) -> NodeResult<NodeInfo> {
        Ok(self.node.node_info().await)
    }

    async fn inventory(&self) -> NodeResult<Vec<SandboxStatus>> {
        Ok(self.node.statuses().await)
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
        if self.node.pressure.disk() {
            return Err(api::NodeError::new(
                api::ErrorKind::NoRoom,
                "the node's disk is below its free-space floor; no sandboxes start until space is freed (see `warren ps` and docs/configuration.md)",
            ));
        }
        if self.node.pressure.memory() {
            return Err(api::NodeError::new(
                api::ErrorKind::NoRoom,
                "the host's available memory is below the node's floor; no sandboxes start until memory is freed (see docs/configuration.md, \"Requests and limits\")",
            ));
        }
        let id = req.id.clone();
        let resolving = std::time::Instant::now();
        let image = self
            .node
            .images
            .for_sandbox(&req)
            .await
            .map_err(|missing| match missing {
                NoImage::Local(e) => {
                    let mut e = contract_error(e);
                    e.message = format!(
                        "{} (image {:?} is local to each node: import it through the control plane, which imports it on every node, or give the server a --cluster-registry to publish local images to)",
                        e.message, req.spec.image
                    );
                    e
                }
                NoImage::Pull { pinned, error } => {
                    let mut e = contract_error(error);
                    e.message = format!(
                        "this node lacks the image and pulling {pinned} failed: {}",
                        e.message
                    );
                    e
                }
                NoImage::Unusable(e) => contract_error(e),
            })?;
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
        answer(self.node.start_main(id))
    }

    async fn destroy(&self, id: &str, why: &str) -> NodeResult<Option<Usage>> {
        answer(self.node.destroy(id, why).await)
    }

    async fn set_paused(&self, id: &str, paused: bool) -> NodeResult<()> {
        answer(self.node.set_paused(id, paused).await)
    }

    async fn hold(&self, id: &str, hold_for: Duration, note: LogNote) -> NodeResult<Option<Usage>> {
        answer(self.node.hold(id, hold_for, &note).await)
    }

    async fn set_ttl(&self, id: &str, ttl: Duration) -> NodeResult<()> {
        self.node.renew_lease(id);
        answer(self.node.set_ttl(id, ttl))
    }

    async fn claim(&self, id: &str, spec: SandboxSpec) -> NodeResult<SandboxStatus> {
        answer(self.node.claim(id, spec).await)?;
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
        let rx = answer(self.node.exec(id, &req).await)?;
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx).boxed())
    }

    async fn exec_input(
        &self,
        id: &str,
        exec_id: &str,
        data: Bytes,
        close: bool,
    ) -> NodeResult<()> {
        answer(self.node.execs.input(id, exec_id, data, close).await)
    }

    async fn exec_resize(&self, id: &str, exec_id: &str, size: WindowSize) -> NodeResult<()> {
        answer(self.node.execs.resize(id, exec_id, size).await)
    }

    async fn write_file(&self, id: &str, req: WriteFile, body: ByteStream) -> NodeResult<()> {
        answer(self.node.write_file(id, req, body).await)
    }

    async fn read_file(&self, id: &str, path: &str) -> NodeResult<FileRead> {
        answer(self.node.read_file(id, path).await)
    }

    async fn path_op(&self, id: &str, op: PathOp) -> NodeResult<Vec<PathEntry>> {
        answer(self.node.path_op(id, op).await)
    }

    async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> NodeResult<BoxStream<'static, WatchEvent>> {
        let changes = answer(self.node.watch_dir(id, path, recursive).await)?;
        Ok(changes
            .map(|change| match change {
                Ok((name, kind)) => WatchEvent::Event { name, kind },
                Err(e) => WatchEvent::Error {
                    error: contract_error(e),
                },
            })
            .boxed())
    }

    async fn logs(&self, id: &str, follow: bool) -> NodeResult<ByteStream> {
        let lines = answer(self.node.log_lines(id, follow))?;
        Ok(lines
            .map(|r| r.map_err(|e| api::NodeError::internal(format!("reading the log: {e}"))))
            .boxed())
    }

    async fn connect_port(&self, id: &str, port: u16) -> NodeResult<Box<dyn Tunnel>> {
        self.node.renew_lease(id);
        Ok(Box::new(answer(self.node.connect_port(id, port).await)?))
    }

    async fn check_network(&self, network: NetworkSpec) -> NodeResult<()> {
        answer(self.node.check_network(&network))
    }

    async fn set_network(&self, id: &str, network: NetworkSpec) -> NodeResult<PolicyChange> {
        let change = answer(self.node.update_network(id, &network).await)?;
        Ok(PolicyChange {
            closed: change.closed,
            unlistened: change.unlistened,
        })
    }

    async fn commit(&self, id: &str, req: CommitImage) -> NodeResult<ImageInfo> {
        self.node.renew_lease(id);
        let name = answer(target_name(&req.into))?;
        let image = answer(self.node.commit(id, &name, req.created_by).await)?;
        Ok(image_info(&image))
    }

    async fn fork_layer(&self, id: &str) -> NodeResult<ForkLayer> {
        self.node.renew_lease(id);
        answer(self.node.fork_layer(id).await)
    }

    async fn release_fork_layer(&self, layer: &str) -> NodeResult<()> {
        self.node.release_fork_layer(layer).await;
        Ok(())
    }

    async fn image_list(&self) -> NodeResult<Vec<ImageInfo>> {
        let records = answer(self.node.images.records().await)?;
        Ok(records.iter().map(image_info).collect())
    }

    async fn image_for_create(&self, reference: &str) -> NodeResult<ImageInfo> {
        let image = answer(self.node.images.for_create(reference).await)?;
        answer(self.node.images.check(&image).await)?;
        Ok(image_info(&image))
    }

    async fn image_pull(&self, reference: &str) -> NodeResult<BoxStream<'static, PullUpdate>> {
        let steps = self.node.images.pull_with_progress(reference);
        Ok(steps
            .map(|step| match step {
                PullStep::Progress(event) => PullUpdate::Progress { event },
                PullStep::Done(done) => match *done {
                    Ok(image) => PullUpdate::Image {
                        image: image_info(&image),
                    },
                    Err(e) => PullUpdate::Error {
                        error: contract_error(e),
                    },
                },
            })
            .boxed())
    }

    async fn image_derive(&self, req: DeriveImage) -> NodeResult<ImageInfo> {
        let name = answer(target_name(&req.into))?;
        let derived = self
            .node
            .images
            .derive(&req.base, &name, req.settings, req.created_by)
            .await;
        Ok(image_info(&answer(derived)?))
    }

    async fn image_step(&self, key: &str) -> NodeResult<Option<ImageInfo>> {
        Ok(answer(self.node.images.step(key).await)?.map(|r| image_info(&r)))
    }

    async fn image_import(&self, name: &str, archive: ByteStream) -> NodeResult<ImageInfo> {
        Ok(image_info(&answer(
            self.node.images.import_upload(name, archive).await,
        )?))
    }

    async fn image_push(&self, reference: &str, source: Option<&str>) -> NodeResult<Pushed> {
        let (image, pushed) = answer(self.node.images.push(reference, source).await)?;
        Ok(Pushed {
            image: image_info(&image),
            uploaded: pushed.uploaded,
            mounted: pushed.mounted,
        })
    }

    async fn image_remove(&self, reference: &str) -> NodeResult<ImageInfo> {
        Ok(image_info(&answer(
            self.node
                .images
                .remove(reference, || self.node.images_in_use())
                .await,
        )?))
    }

    async fn image_gc(&self, budget: Option<u64>) -> NodeResult<GcReport> {
        let r = answer(self.node.images.prune(budget).await)?;
        Ok(GcReport {
            removed: r.removed,
            used_before: r.used_before,
            used_after: r.used_after,
        })
    }

    async fn volume_create(&self, req: VolumeRequest) -> NodeResult<VolumeInfo> {
        let node = self.node.clone();
        answer(blocking(move || node.volumes.create(&req)).await)
    }

    async fn volume_list(&self) -> NodeResult<Vec<VolumeInfo>> {
        let node = self.node.clone();
        answer(blocking(move || node.volumes.list()).await)
    }

    async fn volume_remove(&self, name: &VolumeName) -> NodeResult<VolumeInfo> {
        let (node, name) = (self.node.clone(), name.clone());
        answer(blocking(move || node.volumes.remove(&name)).await)
    }

    async fn volume_write(
        &self,
        volume: &VolumeName,
        req: VolumeWrite,
        body: ByteStream,
    ) -> NodeResult<PathEntry> {
        in_volume(self.node.volume_write(volume, req, body).await)
    }

    async fn volume_read(&self, volume: &VolumeName, path: &str) -> NodeResult<FileRead> {
        in_volume(self.node.volume_read(volume, path).await)
    }

    async fn volume_path_op(&self, volume: &VolumeName, op: PathOp) -> NodeResult<Vec<PathEntry>> {
        in_volume(self.node.volume_path_op(volume, op).await)
    }
}

/// Runs the node's blocking work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, NodeError> + Send + 'static,
) -> Result<T, NodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NodeError::Internal(format!("node task: {e}")))?
}

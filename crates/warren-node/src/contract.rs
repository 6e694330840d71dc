//! The in-process transport of the node contract: [`LocalNode`] answers
//! [`NodeApi`] by calling the node directly (no serialization, no copies
//! beyond the byte streams themselves). It only maps calls to the node's
//! methods and the node's values and errors to the contract's: the node's
//! own errors become the contract's categories here, and nowhere else.

use std::sync::Arc;

use futures_util::StreamExt;
use warren_node_api as api;
use warren_node_api::calls::prelude::*;
use warren_node_api::NodeResult;
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
        NodeError::Runtime(RuntimeError::BadImage(m) | RuntimeError::Unsupported(m)) => {
            E::invalid(m)
        }
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

warren_node_api::node_impl! { LocalNode;
    info(self) { Ok(self.node.node_info().await) }
    inventory(self) { Ok(self.node.statuses().await) }

    status(self, id, read_usage) {
        self.node
            .status_of(id, read_usage)
            .ok_or_else(|| api::NodeError::not_found(format!("sandbox {id} is not on this node")))
    }

    events(self, since) { Ok(self.node.feed.subscribe(since)) }

    create(self, req) {
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
        let mut phases = api::Phases::begin();
        let mut resolving = std::time::Instant::now();
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
        phases.took("node_image", &mut resolving);
        // In a task of its own: a caller that goes away (a control plane
        // killed mid-create) must not leave a sandbox half made.
        let node = self.node.clone();
        let (created, phases) = tokio::spawn(async move {
            let created = node.create(req, &image, &mut phases).await;
            (created, phases)
        })
        .await
        .map_err(|e| api::NodeError::internal(format!("create task: {e}")))?;
        created.map_err(contract_error)?;
        let mut status = self.node.status_of(&id, false).ok_or_else(|| {
            api::NodeError::conflict(format!("sandbox {id} was destroyed as it was created"))
        })?;
        status.phases = phases.into_vec();
        Ok(status)
    }

    start_main(self, id) {
        if let Some(log) = self.node.log(id) {
            log.event("running", warren_core::state::reason::READY, "");
        }
        answer(self.node.start_main(id))
    }

    destroy(self, id, why) { answer(self.node.destroy(id, why).await) }
    set_paused(self, id, paused) { answer(self.node.set_paused(id, paused).await) }
    hold(self, id, hold_for, note) { answer(self.node.hold(id, hold_for, &note).await) }

    set_ttl(self, id, ttl) {
        self.node.renew_lease(id);
        answer(self.node.set_ttl(id, ttl))
    }

    claim(self, id, spec) {
        answer(self.node.claim(id, spec).await)?;
        self.node.status_of(id, false).ok_or_else(|| {
            api::NodeError::not_found(format!("sandbox {id} was destroyed as it was claimed"))
        })
    }

    renew_lease(self, id) {
        self.node.renew_lease(id);
        Ok(())
    }

    note(self, id, note) {
        if let Some(log) = self.node.log(id) {
            log.event(&note.state, &note.reason, &note.message);
        }
        Ok(())
    }

    exec(self, id, req) {
        self.node.renew_lease(id);
        let rx = answer(self.node.exec(id, &req).await)?;
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx).boxed())
    }

    exec_input(self, id, exec_id, data, close) {
        answer(self.node.execs.input(id, exec_id, data, close).await)
    }

    exec_resize(self, id, exec_id, size) {
        answer(self.node.execs.resize(id, exec_id, size).await)
    }

    write_file(self, id, req, body) { answer(self.node.write_file(id, req, body).await) }
    read_file(self, id, path) { answer(self.node.read_file(id, path).await) }
    path_op(self, id, op) { answer(self.node.path_op(id, op).await) }

    watch(self, id, path, recursive) {
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

    logs(self, id, follow) {
        let lines = answer(self.node.log_lines(id, follow))?;
        Ok(lines
            .map(|r| r.map_err(|e| api::NodeError::internal(format!("reading the log: {e}"))))
            .boxed())
    }

    ship(self, journal, after, max, wait) {
        let Some(j) = self.node.logs.journal() else {
            return Err(api::NodeError::invalid(
                "this node does not ship its logs (started with --no-log-shipping)",
            ));
        };
        // Bounds of one answer: the control plane writes each batch in one
        // transaction, and a long poll must end well within the call's
        // quick deadline.
        const MOST: u32 = 10_000;
        const MOST_BYTES: usize = 4 << 20;
        const LONGEST_WAIT: Duration = Duration::from_secs(10);
        j.read(journal, after, max.clamp(1, MOST), MOST_BYTES, wait.min(LONGEST_WAIT))
            .await
            .map_err(|e| api::NodeError::internal(e.to_string()))
    }

    connect_port(self, id, port) {
        self.node.renew_lease(id);
        answer(self.node.connect_port(id, port).await)
    }

    check_network(self, network) { answer(self.node.check_network(&network)) }

    set_network(self, id, network) {
        let change = answer(self.node.update_network(id, &network).await)?;
        Ok(PolicyChange {
            closed: change.closed,
            unlistened: change.unlistened,
        })
    }

    commit(self, id, req) {
        self.node.renew_lease(id);
        let name = answer(target_name(&req.into))?;
        let image = answer(self.node.commit(id, &name, req.created_by).await)?;
        Ok(image_info(&image))
    }

    fork_layer(self, id) {
        self.node.renew_lease(id);
        answer(self.node.fork_layer(id).await)
    }

    release_fork_layer(self, layer) {
        self.node.release_fork_layer(layer).await;
        Ok(())
    }

    image_list(self) {
        let records = answer(self.node.images.records().await)?;
        Ok(records.iter().map(image_info).collect())
    }

    image_for_create(self, reference) {
        let image = answer(self.node.images.for_create(reference).await)?;
        answer(self.node.images.check(&image).await)?;
        Ok(image_info(&image))
    }

    image_pull(self, reference) {
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

    image_derive(self, req) {
        let name = answer(target_name(&req.into))?;
        let derived = self
            .node
            .images
            .derive(&req.base, &name, req.settings, req.created_by)
            .await;
        Ok(image_info(&answer(derived)?))
    }

    image_step(self, key) { Ok(answer(self.node.images.step(key).await)?.map(|r| image_info(&r))) }

    image_import(self, name, archive) {
        Ok(image_info(&answer(self.node.images.import_upload(name, archive).await)?))
    }

    image_push(self, reference, source) {
        let (image, pushed) = answer(self.node.images.push(reference, source).await)?;
        Ok(Pushed {
            image: image_info(&image),
            uploaded: pushed.uploaded,
            mounted: pushed.mounted,
        })
    }

    image_remove(self, reference) {
        let in_use = || self.node.images_in_use();
        Ok(image_info(&answer(self.node.images.remove(reference, in_use).await)?))
    }

    image_gc(self, budget) {
        let r = answer(self.node.images.prune(budget).await)?;
        Ok(GcReport {
            removed: r.removed,
            used_before: r.used_before,
            used_after: r.used_after,
        })
    }

    volume_create(self, req) {
        let node = self.node.clone();
        answer(blocking(move || node.volumes.create(&req)).await)
    }

    volume_list(self) {
        let node = self.node.clone();
        answer(blocking(move || node.volumes.list()).await)
    }

    volume_remove(self, name) {
        let (node, name) = (self.node.clone(), name.clone());
        answer(blocking(move || node.volumes.remove(&name)).await)
    }

    volume_write(self, volume, req, body) {
        in_volume(self.node.volume_write(volume, req, body).await)
    }

    volume_read(self, volume, path) { in_volume(self.node.volume_read(volume, path).await) }
    volume_path_op(self, volume, op) { in_volume(self.node.volume_path_op(volume, op).await) }
}

/// Runs the node's blocking work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, NodeError> + Send + 'static,
) -> Result<T, NodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NodeError::Internal(format!("node task: {e}")))?
}

//! The in-process transport of the node contract: [`LocalNode`] answers
//! [`NodeApi`] by calling the node directly (no serialization, no copies
//! beyond the byte streams themselves). It only maps calls to the node's
//! methods and the node's values to the contract's; the node's errors
//! become the contract's categories in [`crate::errors`].

use std::sync::Arc;

use futures_util::StreamExt;
use warren_node_api as api;
use warren_node_api::calls::prelude::*;
use warren_node_api::NodeResult;

use crate::errors::{contract_error, volume_error};
use crate::file_access::InVolume;
use crate::image_calls::{image_info, target_name, PullStep};
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

/// A volume call's answer: finding the volume fails as the node says,
/// the file work worded for a volume.
fn in_volume<T>(answer: InVolume<T>) -> NodeResult<T> {
    answer.map_err(contract_error)?.map_err(volume_error)
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

    create(self, req) { answer(self.node.create_sandbox(req).await) }

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

    ship(self, journal, after, max, wait) { answer(self.node.ship(journal, after, max, wait).await) }

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

    fork_layer(self, id, processes) {
        self.node.renew_lease(id);
        answer(self.node.fork_layer(id, processes).await)
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

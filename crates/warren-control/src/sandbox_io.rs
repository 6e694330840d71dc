//! What a client does with a sandbox beyond its lifecycle: files, logs,
//! ports, its TTL, commits. The control plane checks the sandbox's state
//! and renews its lease, then hands the call to the node.

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use warren_core::{ApiError, SandboxState, Selector};
use warren_node_api::{
    ByteStream, FileRead, ImageInfo, PathEntry, PathOp, Tunnel, WatchEvent, WriteFile,
};

use crate::control::{node_error, Control};
use crate::store::SandboxRow;

/// States in which a sandbox has files: live, or held after it finished.
fn has_files(state: SandboxState) -> bool {
    matches!(
        state,
        SandboxState::Running | SandboxState::Paused | SandboxState::Kept | SandboxState::Stopping
    )
}

impl Control {
    /// The sandbox exists and has files now (the node renews its lease on
    /// the file call; a refused one renews it here).
    async fn file_access(
        &self,
        id: &str,
    ) -> Result<std::sync::Arc<dyn warren_node_api::NodeApi>, ApiError> {
        let row = self.get(id).await?;
        if !has_files(row.state) {
            self.touch(id).await;
            return Err(ApiError::conflict(format!(
                "sandbox {id} is {}; files need a running or kept sandbox",
                row.state
            )));
        }
        self.api(&row.node)
    }

    pub async fn write_file(
        &self,
        id: &str,
        req: WriteFile,
        body: ByteStream,
    ) -> Result<(), ApiError> {
        self.file_access(id)
            .await?
            .write_file(id, req, body)
            .await
            .map_err(node_error)
    }

    pub async fn read_file(&self, id: &str, path: &str) -> Result<FileRead, ApiError> {
        self.file_access(id)
            .await?
            .read_file(id, path)
            .await
            .map_err(node_error)
    }

    /// Looks at or changes paths in the sandbox (stat, list, make a
    /// directory, rename, remove).
    pub async fn path_op(&self, id: &str, op: PathOp) -> Result<Vec<PathEntry>, ApiError> {
        self.file_access(id)
            .await?
            .path_op(id, op)
            .await
            .map_err(node_error)
    }

    /// The events of directory `path` in the sandbox (with `recursive`,
    /// of its subdirectories too) as they happen, until the stream is
    /// dropped, the directory goes, or the control plane stops.
    pub async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<BoxStream<'static, WatchEvent>, ApiError> {
        let events = self
            .file_access(id)
            .await?
            .watch(id, path, recursive)
            .await
            .map_err(node_error)?;
        Ok(events.take_until(self.lifecycle.stopped()).boxed())
    }

    /// The sandbox's log; with `follow`, until it has ended (or is held).
    pub async fn logs(&self, id: &str, follow: bool) -> Result<ByteStream, ApiError> {
        let row = self.get(id).await?;
        let lines = self
            .api(&row.node)?
            .logs(id, follow)
            .await
            .map_err(node_error)?;
        Ok(lines.take_until(self.lifecycle.stopped()).boxed())
    }

    /// The logs of every sandbox matching `selector`, one after another in
    /// creation order, streamed line by line.
    pub async fn logs_by_label(&self, selector: &Selector) -> Result<ByteStream, ApiError> {
        let members: Vec<_> = self
            .list(&[], selector)
            .await?
            .into_iter()
            .map(|s| (self.api(&s.node).ok(), s.id))
            .collect();
        Ok(futures_util::stream::iter(members)
            .then(|(node, id)| async move {
                // A sandbox whose log has expired (or whose node is gone)
                // has no lines to give.
                match node {
                    Some(node) => node
                        .logs(&id, false)
                        .await
                        .unwrap_or_else(|_| futures_util::stream::empty().boxed()),
                    None => futures_util::stream::empty().boxed(),
                }
            })
            .flatten()
            .take_until(self.lifecycle.stopped())
            .boxed())
    }

    /// A connection to `port` on the sandbox's loopback.
    pub async fn connect_port(&self, id: &str, port: u16) -> Result<Box<dyn Tunnel>, ApiError> {
        let row = self.get(id).await?;
        self.api(&row.node)?
            .connect_port(id, port)
            .await
            .map_err(node_error)
    }

    /// The sandbox may live `ttl` from now.
    pub async fn set_ttl(
        &self,
        id: &str,
        ttl: warren_core::spec::Dur,
    ) -> Result<SandboxRow, ApiError> {
        let ttl = ttl.get();
        if ttl.is_zero() {
            return Err(ApiError::bad_request("ttl must be greater than zero"));
        }
        let row = self.get(id).await?;
        if !matches!(row.state, SandboxState::Running | SandboxState::Paused) {
            return Err(ApiError::conflict(format!(
                "sandbox {id} is {}; only a running or paused sandbox has a TTL to change",
                row.state
            )));
        }
        self.api(&row.node)?
            .set_ttl(id, ttl)
            .await
            .map_err(node_error)?;
        Ok(row)
    }

    /// The sandbox's changes as a new image (under a name, published to
    /// the cluster registry when there is one; or a build step's key).
    pub async fn commit(
        &self,
        id: &str,
        req: warren_node_api::CommitImage,
    ) -> Result<ImageInfo, ApiError> {
        let row = self.get(id).await?;
        match row.state {
            SandboxState::Running | SandboxState::Paused | SandboxState::Kept => {}
            other => {
                return Err(ApiError::conflict(format!(
                    "sandbox {id} is {other:?}; only a running, paused or kept sandbox can be committed"
                )));
            }
        }
        let node = self.api(&row.node)?;
        let name = match &req.into {
            warren_node_api::ImageTarget::Name(name) => Some(name.clone()),
            warren_node_api::ImageTarget::Step(_) => None,
        };
        let image = node.commit(id, req).await.map_err(node_error)?;
        if let Some(name) = name {
            self.publish(node.as_ref(), &name).await?;
        }
        Ok(image)
    }
}

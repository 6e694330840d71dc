//! A sandbox's commit: its changes written as a new image layer while its
//! processes are frozen.

use std::sync::Arc;

use warren_image::ImageRecord;
use warren_node_api::Phase;

use crate::{Node, NodeError};

impl Node {
    /// Records the sandbox's filesystem changes as a new layer on top of its
    /// image, under `name`. A running sandbox's processes are frozen while
    /// the layer is written (so files are not caught half-changed) and
    /// thawed after; a paused or kept sandbox is already frozen.
    pub async fn commit(
        self: &Arc<Self>,
        id: &str,
        name: &str,
        created_by: Option<String>,
    ) -> Result<ImageRecord, NodeError> {
        let live = self.get(id)?;
        let freeze = live.phase() == Phase::Running;
        let upper = self.runtime.upper_dir(id).ok_or_else(|| {
            NodeError::BadRequest(format!(
                "sandbox {id} has a disk limit; its changes live on its own file system, \
                 which commit cannot read yet: create the sandbox without --disk to commit it"
            ))
        })?;
        if freeze {
            self.freeze(id, true).await?;
        }
        let created_by = created_by.unwrap_or_else(|| format!("warren commit {id}"));
        let owners = warren_image::Owners {
            root: self.runtime.id_range(id).map(|r| r.base),
        };
        let result = self
            .images
            .commit_changes(&live.image, upper, owners, name, created_by)
            .await;
        if freeze {
            if let Err(e) = self.freeze(id, false).await {
                tracing::warn!(id, error = %e, "could not thaw the sandbox after commit");
            }
        }
        result
    }
}

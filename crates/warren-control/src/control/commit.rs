//! A sandbox's changes kept as a new image.

use warren_core::image::{CommitImage, ImageInfo, ImageTarget};
use warren_core::tenant::Principal;
use warren_core::{ApiError, SandboxState};

use super::Control;
use crate::node_errors::node_error;

impl Control {
    /// The sandbox's changes as a new image (under a name, published to
    /// the cluster registry when there is one; or a build step's key).
    /// A name is claimed for `who`'s tenant (see [`crate::images::Images::claim`]).
    pub async fn commit(
        &self,
        who: &Principal,
        id: &str,
        req: CommitImage,
    ) -> Result<ImageInfo, ApiError> {
        let row = self.records.row(id).await?;
        match row.state {
            SandboxState::Running | SandboxState::Paused | SandboxState::Kept => {}
            other => {
                return Err(ApiError::conflict(format!(
                    "sandbox {id} is {other:?}; only a running, paused or kept sandbox can be committed"
                )));
            }
        }
        let node = self.nodes.api(&row.node)?;
        let name = match &req.into {
            ImageTarget::Name(name) => Some(name.clone()),
            ImageTarget::Step(_) => None,
        };
        if let Some(name) = &name {
            self.images.claim(who, name).await?;
        }
        let image = node.commit(id, req).await.map_err(node_error)?;
        if let Some(name) = name {
            self.images.publish(node.as_ref(), &name).await?;
        }
        Ok(image)
    }
}

//! Images, as the control plane asks its node for them: references are
//! checked here (a pull needs a registry), the node's store does the rest.

use futures_util::stream::BoxStream;
use warren_core::image_ref::registry_host;
use warren_core::ApiError;
use warren_node_api::{ByteStream, GcReport, ImageInfo, PullUpdate, Pushed};

use crate::control::{node_error, Control};

/// `reference` must name a registry; `what` says for which call.
fn needs_registry(reference: &str, what: &str) -> Result<(), ApiError> {
    if registry_host(reference).is_some() {
        return Ok(());
    }
    let hint = match what {
        "pull" => "pull takes host[:port]/repository[:tag|@sha256:digest], e.g. \
             registry.example.com/team/app:v1 (local archives are imported with `warren image import`)",
        "push" => "push takes host[:port]/repository:tag (use --from to push a local image under that name)",
        _ => "prewarm takes host[:port]/repository[:tag|@sha256:digest]",
    };
    Err(ApiError::bad_request(format!(
        "{reference:?} names no registry; {hint}"
    )))
}

impl Control {
    pub async fn images(&self) -> Result<Vec<ImageInfo>, ApiError> {
        self.node.image_list().await.map_err(node_error)
    }

    pub async fn import_image(
        &self,
        name: &str,
        archive: ByteStream,
    ) -> Result<ImageInfo, ApiError> {
        self.node
            .image_import(name, archive)
            .await
            .map_err(node_error)
    }

    /// A registry pull's progress, then the image or the error.
    pub async fn pull_image(
        &self,
        reference: &str,
    ) -> Result<BoxStream<'static, PullUpdate>, ApiError> {
        needs_registry(reference, "pull")?;
        self.node.image_pull(reference).await.map_err(node_error)
    }

    pub async fn push_image(
        &self,
        reference: &str,
        source: Option<&str>,
    ) -> Result<Pushed, ApiError> {
        needs_registry(reference, "push")?;
        self.node
            .image_push(reference, source)
            .await
            .map_err(node_error)
    }

    pub async fn gc_images(&self, budget: Option<u64>) -> Result<GcReport, ApiError> {
        self.node.image_gc(budget).await.map_err(node_error)
    }

    /// Pulls `reference` onto `nodes` (every node when empty) ahead of the
    /// sandboxes that will run it; what each node now holds.
    pub async fn prewarm(
        &self,
        reference: &str,
        nodes: &[String],
    ) -> Result<Vec<(String, ImageInfo)>, ApiError> {
        let name = &self.node_name;
        if let Some(unknown) = nodes.iter().find(|n| *n != name) {
            return Err(ApiError::bad_request(format!(
                "unknown node {unknown:?}; this cluster has {name:?} (see `GET /v1/nodes`), nothing was pulled"
            )));
        }
        needs_registry(reference, "prewarm")?;
        let image = self
            .node
            .image_for_create(reference)
            .await
            .map_err(node_error)?;
        Ok(vec![(name.clone(), image)])
    }

    pub async fn remove_image(&self, reference: &str) -> Result<ImageInfo, ApiError> {
        self.node.image_remove(reference).await.map_err(node_error)
    }
}

//! The node contract's image calls as the node does them: the image a
//! create runs (pulled by digest when another node resolved it), a pull
//! with its progress, an import from an upload, the step cache, removal.

use std::sync::Arc;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use warren_image::ImageRecord;
use warren_node_api::{ByteStream, CreateSandbox, ImageTarget};

use crate::images::Images;
use crate::NodeError;

/// An image record as the contract shows it.
pub(crate) fn image_info(r: &ImageRecord) -> warren_node_api::ImageInfo {
    warren_node_api::ImageInfo {
        name: r.name.clone(),
        digest: r.digest.clone(),
        layers: r.layers.len(),
        record: serde_json::to_value(r).unwrap_or_default(),
    }
}

/// Why a create has no image to run.
#[derive(Debug, thiserror::Error)]
pub enum NoImage {
    /// Not on this node, and the create names no reference to pull.
    #[error("not on this node: {0}")]
    Local(#[source] NodeError),
    /// Pulling the reference the control plane pinned failed.
    #[error("pulling {pinned} failed: {error}")]
    Pull {
        pinned: String,
        #[source]
        error: NodeError,
    },
    /// The image is here but cannot run.
    #[error(transparent)]
    Unusable(NodeError),
}

/// A pull's progress (one of the store's events), then how it ended
/// (boxed: a record and an error are large beside an event).
pub(crate) enum PullStep {
    Progress(serde_json::Value),
    Done(Box<Result<ImageRecord, NodeError>>),
}

impl Images {
    /// The image `req` runs: the one resolved here, or, in a cluster where
    /// the control plane resolved the tag on another node, exactly that
    /// digest fetched from the registry.
    pub(crate) async fn for_sandbox(&self, req: &CreateSandbox) -> Result<ImageRecord, NoImage> {
        let missing = match self.resolve(&req.image_digest).await {
            Ok(image) => return Ok(image),
            Err(e) => e,
        };
        let Some(pinned) = req.image_source.clone() else {
            return Err(NoImage::Local(missing));
        };
        let image = match self.pull(&pinned, None).await {
            Ok(image) => image,
            Err(error) => return Err(NoImage::Pull { pinned, error }),
        };
        self.check(&image).await.map_err(NoImage::Unusable)?;
        Ok(image)
    }

    /// Pulls `reference` in a task of its own, which runs to its end even
    /// if the stream is dropped, so the store never keeps a half-finished
    /// pull's pins or files.
    pub(crate) fn pull_with_progress(
        self: &Arc<Self>,
        reference: &str,
    ) -> BoxStream<'static, PullStep> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<PullStep>();
        let events = tx.clone();
        let progress: warren_image::Progress = Arc::new(move |e| {
            if let Ok(event) = serde_json::to_value(&e) {
                let _ = events.send(PullStep::Progress(event));
            }
        });
        let (images, reference) = (self.clone(), reference.to_string());
        tokio::spawn(async move {
            let done = images.pull(&reference, Some(progress)).await;
            let _ = tx.send(PullStep::Done(Box::new(done)));
        });
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed()
    }

    /// Imports an OCI image-layout or docker-archive tar from an upload,
    /// spooled to a file under the node's home first.
    pub(crate) async fn import_upload(
        &self,
        name: &str,
        mut archive: ByteStream,
    ) -> Result<ImageRecord, NodeError> {
        let tmp_dir = self.tmp_dir();
        let internal = |e: std::io::Error| NodeError::Internal(e.to_string());
        tokio::fs::create_dir_all(tmp_dir).await.map_err(internal)?;
        // Removed when dropped, whatever happens below.
        let tmp = tempfile::Builder::new()
            .prefix("upload-")
            .suffix(".tar")
            .tempfile_in(tmp_dir)
            .map_err(internal)?;
        use tokio::io::AsyncWriteExt;
        let mut file = tokio::fs::File::from_std(tmp.reopen().map_err(internal)?);
        while let Some(chunk) = archive.next().await {
            let chunk =
                chunk.map_err(|e| NodeError::BadRequest(format!("upload interrupted: {e}")))?;
            file.write_all(&chunk).await.map_err(internal)?;
        }
        file.flush().await.map_err(internal)?;
        let images = self.store();
        let (path, name) = (tmp.path().to_path_buf(), name.to_string());
        Ok(
            tokio::task::spawn_blocking(move || images.import_archive(&path, &name))
                .await
                .map_err(joined)??,
        )
    }

    /// Every image of the store.
    pub(crate) async fn records(&self) -> Result<Vec<ImageRecord>, NodeError> {
        let images = self.store();
        Ok(tokio::task::spawn_blocking(move || images.list())
            .await
            .map_err(joined)??)
    }

    /// The image the build step cache holds under `key`, if any.
    pub(crate) async fn step(&self, key: &str) -> Result<Option<ImageRecord>, NodeError> {
        let name = target_name(&ImageTarget::Step(key.to_string()))?;
        let images = self.store();
        let found = tokio::task::spawn_blocking(move || images.resolve(&name))
            .await
            .map_err(joined)?;
        match found {
            Ok(record) => Ok(Some(record)),
            Err(e) if e.kind() == warren_image::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes an image no live sandbox runs; `in_use` lists the digests
    /// they run (asked once the reference is resolved).
    pub(crate) async fn remove(
        &self,
        reference: &str,
        in_use: impl FnOnce() -> Vec<String>,
    ) -> Result<ImageRecord, NodeError> {
        let image = self.resolve(reference).await?;
        if in_use().contains(&image.digest) {
            return Err(NodeError::Conflict(format!(
                "image {reference} is used by a live sandbox; remove those sandboxes first (`warren ps`)"
            )));
        }
        let images = self.store();
        let reference = reference.to_string();
        Ok(
            tokio::task::spawn_blocking(move || images.remove(&reference))
                .await
                .map_err(joined)??,
        )
    }
}

/// The store name an image made on this node is recorded under; a name
/// in the step cache's repository is the step cache's alone.
pub(crate) fn target_name(target: &ImageTarget) -> Result<String, NodeError> {
    match target {
        ImageTarget::Name(name) if warren_image::is_step_name(name) => Err(NodeError::BadRequest(
            format!("{name:?} is in the build step cache's repository; choose another name"),
        )),
        ImageTarget::Name(name) => Ok(name.clone()),
        ImageTarget::Step(key) => warren_image::step_name(key).ok_or_else(|| {
            NodeError::BadRequest(format!("step key {key:?} is not 64 lowercase hex digits"))
        }),
    }
}

fn joined(e: tokio::task::JoinError) -> NodeError {
    NodeError::Internal(format!("node task: {e}"))
}
